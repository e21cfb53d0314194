"""canarchy: a CLI-first CAN / CAN FD toolkit with typed output.

Importing the package is cheap on purpose: it imports neither python-can nor
any module that resolves a path under the user's home. Command modules import
what they need when they run.
"""

__version__ = "0.1.0"
