"""The hermetic pytest plugin: what a project's pytest loads (guards, sandbox, containment).

Never imports :mod:`canarchy.testing.lanes`.
"""

import os

_HERE = os.path.dirname(os.path.realpath(__file__))
#: Where a child Python finds the plugin's ``sitecustomize`` (first on its ``PYTHONPATH``).
CHILD_HOOK_DIR = os.path.join(_HERE, "_subprocess")
#: The directory ``canarchy`` is imported from, for a child Python's ``PYTHONPATH``.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
