"""``plugins list|enable|disable``: entry point discovery and the config file's plugin tables.

Plugins are real entry points: each test writes a tiny ``*.dist-info``
(METADATA + entry_points.txt) into a directory it puts on ``sys.path``; nothing
is pip-installed. The config file is the test's own ``~/.canarchy/config.toml``
(the hermetic home), resolved by canarchy at call time.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import os
import sys
from pathlib import Path

import pytest

from canarchy import config, plugins
from tests.helpers import run_cli, write_user_config

# A config a person wrote by hand: comments, odd spacing, unusual order.
HANDWRITTEN = """\
# canarchy settings -- kept by hand, do not reformat
[transport]   # the bus I use
interface   =  "virtual"     # in-process
default_interface="vcan0"

[plugins.demo]      # the demo decoder
enabled = false     # off until it is reviewed


[safety]
    require_active_ack   = true  # always ask
"""


def make_dist(site: Path, name: str, version: str, entry_points: str) -> Path:
    """Write ``<name>-<version>.dist-info`` with METADATA and ``entry_points`` (the file's text)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    return info


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A directory on sys.path holding one plugin distribution, ``demo-plugin 1.2``: plugin
    ``demo`` in two groups, ``other`` in one, plus a console script canarchy must ignore.
    Its module raises on import, so a test notices if discovery imports anything."""
    root = tmp_path / "site"
    root.mkdir()
    make_dist(root, "demo-plugin", "1.2", (
        "[canarchy.decoders]\ndemo = demo_canarchy_plugin:Decoder\n\n"
        "[canarchy.processors]\ndemo = demo_canarchy_plugin:Processor\nother = demo_canarchy_plugin:Other\n\n"
        "[console_scripts]\ndemo-tool = demo_canarchy_plugin:main\n"))
    (root / "demo_canarchy_plugin.py").write_text("raise RuntimeError('a plugin module was imported')\n")
    monkeypatch.syspath_prepend(str(root))
    # Listings see only this directory's distributions, so a canarchy plugin installed on the
    # machine cannot change a result (test_discovery_walks_sys_path runs unconfined).
    everything = plugins._distributions
    monkeypatch.setattr(plugins, "_distributions",
                        lambda: (d for d in everything() if Path(str(d.locate_file(""))) == root))
    return root


def config_file() -> Path:
    return Path.home() / ".canarchy" / "config.toml"


# -- list ---------------------------------------------------------------------------------------

def test_list_discovers_entry_points_without_importing_them(site):
    result = run_cli("plugins", "list", "--json")
    assert result.code == 0, result.out
    by_name = {p["name"]: p for p in result.data["plugins"]}
    assert set(by_name) == {"demo", "other"}
    demo = by_name["demo"]
    assert demo["installed"] is True
    assert (demo["enabled"], demo["state_source"]) == (False, "default")  # installed is not enabled
    assert demo["groups"] == ["canarchy.processors", "canarchy.decoders"]
    assert demo["entry_points"] == [
        {"group": "canarchy.processors", "value": "demo_canarchy_plugin:Processor",
         "distribution": "demo-plugin", "version": "1.2"},
        {"group": "canarchy.decoders", "value": "demo_canarchy_plugin:Decoder",
         "distribution": "demo-plugin", "version": "1.2"},
    ]
    assert result.data["groups"] == ["canarchy.processors", "canarchy.decoders", "canarchy.transports"]
    assert "demo_canarchy_plugin" not in sys.modules
    assert not config_file().exists()  # listing writes nothing


def test_discovery_walks_sys_path(tmp_path, monkeypatch):
    """Unconfined: a distribution in a directory put on sys.path is found by the real lookup."""
    root = tmp_path / "elsewhere"
    make_dist(root, "walk-plugin", "0.3", "[canarchy.transports]\nwalker = walk_pkg:Bus\n")
    monkeypatch.syspath_prepend(str(root))
    result = run_cli("plugins", "list", "--json")
    assert result.code == 0, result.out
    [walker] = [p for p in result.data["plugins"] if p["name"] == "walker"]
    assert walker["entry_points"] == [{"group": "canarchy.transports", "value": "walk_pkg:Bus",
                                       "distribution": "walk-plugin", "version": "0.3"}]


def test_list_shows_configured_plugins_that_are_not_installed(site):
    write_user_config("[plugins.gone]\nenabled = true\n\n[plugins.demo]\nenabled = true\n")
    result = run_cli("plugins", "list", "--json")
    by_name = {p["name"]: p for p in result.data["plugins"]}
    assert by_name["gone"] == {"name": "gone", "installed": False, "enabled": True, "state_source": "config",
                               "groups": [], "entry_points": []}
    assert (by_name["demo"]["enabled"], by_name["demo"]["state_source"]) == (True, "config")
    assert (result.data["plugin_count"], result.data["installed_count"], result.data["enabled_count"]) == (3, 2, 2)


def test_list_text(site):
    write_user_config("[plugins.gone]\nenabled = false\n")
    out = run_cli("plugins", "list").out
    assert "demo" in out and "demo_canarchy_plugin:Decoder (demo-plugin 1.2)" in out
    assert "gone" in out and "not installed" in out


def test_a_distribution_with_broken_entry_points_is_a_warning(site):
    make_dist(site, "broken", "0.1", "[canarchy.decoders]\nno equals sign here\n")
    result = run_cli("plugins", "list", "--json")
    assert result.code == 0, result.out
    assert {p["name"] for p in result.data["plugins"]} == {"demo", "other"}
    assert len(result.envelope["warnings"]) == 1
    assert "broken-0.1.dist-info" in result.envelope["warnings"][0]


@pytest.mark.parametrize("text,fragment", [
    ("[plugins\nenabled = true\n", "is not valid TOML"),
    ("plugins = 5\n", "`plugins` must be a table"),
    ("[plugins]\ndemo = true\n", "`plugins.demo` must be a table"),
    ("[plugins.demo]\nenabled = \"yes\"\n", "`plugins.demo.enabled` must be true or false"),
])
def test_list_refuses_a_bad_config(site, text, fragment):
    write_user_config(text)
    result = run_cli("plugins", "list", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"])
    assert fragment in result.envelope["errors"][0]["message"]


# -- enable / disable ---------------------------------------------------------------------------

def test_enable_creates_the_config_file(site):
    result = run_cli("plugins", "enable", "demo", "--json")
    assert result.code == 0, result.out
    assert result.data == {"name": "demo", "installed": True, "groups": ["canarchy.processors", "canarchy.decoders"],
                           "config_path": str(config_file()), "previous": None, "enabled": True, "changed": True}
    assert config_file().read_text() == "[plugins.demo]\nenabled = true\n"
    listed = {p["name"]: p for p in run_cli("plugins", "list", "--json").data["plugins"]}
    assert (listed["demo"]["enabled"], listed["demo"]["state_source"]) == (True, "config")


def test_enable_keeps_comments_and_layout_byte_for_byte(site):
    path = write_user_config(HANDWRITTEN)
    result = run_cli("plugins", "enable", "demo", "--json")
    assert result.code == 0, result.out
    assert (result.data["previous"], result.data["changed"]) == (False, True)
    expected = HANDWRITTEN.replace("enabled = false     # off until", "enabled = true     # off until")
    assert expected != HANDWRITTEN
    assert path.read_text() == expected


def test_a_new_plugin_table_is_the_only_addition(site):
    path = write_user_config(HANDWRITTEN)
    assert run_cli("plugins", "enable", "other", "--json").code == 0
    new = path.read_text()
    added = "[plugins.other]\nenabled = true\n\n"
    assert added in new
    assert new.replace(added, "", 1) == HANDWRITTEN  # everything else is exactly the user's text
    assert config.load_file_values() == {"CANARCHY_PYTHON_CAN_INTERFACE": "virtual",
                                         "CANARCHY_DEFAULT_INTERFACE": "vcan0",
                                         "CANARCHY_REQUIRE_ACTIVE_ACK": True}


@pytest.mark.parametrize("text,expected", [
    # inline table and dotted keys: edited in their own form
    ("plugins = {demo = {enabled = false}}\n", "plugins = {demo = {enabled = true}}\n"),
    ("[plugins]\ndemo.enabled = false # dotted\n", "[plugins]\ndemo.enabled = true # dotted\n"),
    # a file without a final newline, and CRLF line endings, are kept as they are
    ("[safety]\nrequire_active_ack = false", "[safety]\nrequire_active_ack = false\n[plugins.demo]\nenabled = true\n"),
    ("# windows\r\n[plugins.demo]\r\nenabled = false\r\n", "# windows\r\n[plugins.demo]\r\nenabled = true\r\n"),
])
def test_other_layouts(site, text, expected):
    path = config_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode())
    assert run_cli("plugins", "enable", "demo", "--json").code == 0
    assert path.read_bytes() == expected.encode()


def test_disable_then_enable_round_trip(site):
    path = write_user_config(HANDWRITTEN)
    assert run_cli("plugins", "enable", "demo").code == 0
    assert run_cli("plugins", "disable", "demo").code == 0
    assert path.read_text() == HANDWRITTEN


def test_setting_the_current_state_writes_nothing(site, monkeypatch):
    path = write_user_config(HANDWRITTEN)
    monkeypatch.setattr(plugins, "_atomic_write", lambda *a: pytest.fail("the file was rewritten"))
    result = run_cli("plugins", "disable", "demo", "--json")
    assert result.code == 0, result.out
    assert (result.data["previous"], result.data["changed"]) == (False, False)
    assert run_cli("plugins", "disable", "demo").out.startswith("plugin demo already disabled")
    assert path.read_text() == HANDWRITTEN


def test_unknown_plugin_is_refused_and_nothing_is_written(site):
    path = write_user_config(HANDWRITTEN)
    before = path.stat().st_mtime_ns
    for verb in ("enable", "disable"):
        result = run_cli("plugins", verb, "nosuch", "--json")
        assert (result.code, result.error_codes) == (1, ["PLUGIN_NOT_FOUND"])
        assert "demo, other" in result.envelope["errors"][0]["message"]
    assert path.read_text() == HANDWRITTEN and path.stat().st_mtime_ns == before


def test_force_records_the_state_of_a_plugin_not_installed(site):
    path = write_user_config(HANDWRITTEN)
    result = run_cli("plugins", "enable", "future", "--force", "--json")
    assert result.code == 0, result.out
    assert result.data["installed"] is False
    assert result.envelope["warnings"] == ["plugin 'future' is not installed; its state is recorded for when it is"]
    assert path.read_text().replace("[plugins.future]\nenabled = true\n\n", "", 1) == HANDWRITTEN


def test_disable_a_configured_plugin_that_is_not_installed(site):
    write_user_config("[plugins.gone]\nenabled = true\n")
    result = run_cli("plugins", "disable", "gone", "--json")
    assert result.code == 0, result.out
    assert config_file().read_text() == "[plugins.gone]\nenabled = false\n"
    # enabling it again needs it installed (or --force)
    assert run_cli("plugins", "enable", "gone", "--json").error_codes == ["PLUGIN_NOT_FOUND"]


@pytest.mark.parametrize("text", ["[plugins.demo\nenabled = false\n", "plugins = \"all\"\n",
                                  "[plugins.demo]\nenabled = 1\n", "[transport]\ninterface = \n"])
def test_a_config_that_does_not_parse_is_untouched(site, text):
    path = write_user_config(text)
    result = run_cli("plugins", "enable", "demo", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"])
    assert path.read_text() == text
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.toml"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(site, monkeypatch):
    path = write_user_config(HANDWRITTEN)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    result = run_cli("plugins", "enable", "demo", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_WRITE_FAILED"])
    assert "No space left on device" in result.envelope["errors"][0]["message"]
    assert path.read_text() == HANDWRITTEN
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.toml"]


def test_the_write_is_atomic_and_keeps_the_mode(site, monkeypatch):
    path = write_user_config(HANDWRITTEN)
    path.chmod(0o640)
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        src, dst = Path(src), Path(dst)
        replaced.append((src.parent, dst, src.read_text()))
        assert path.read_text() == HANDWRITTEN  # the old file is intact until the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    assert run_cli("plugins", "enable", "demo").code == 0
    [(temp_dir, target, written)] = replaced
    assert temp_dir == path.parent and target == path and written == path.read_text()
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_symlinked_config_stays_a_symlink(site, tmp_path):
    real = tmp_path / "dotfiles" / "canarchy.toml"
    real.parent.mkdir()
    real.write_text(HANDWRITTEN)
    link = config_file()
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    assert run_cli("plugins", "enable", "demo").code == 0
    assert link.is_symlink()
    assert "enabled = true     # off until" in real.read_text()


def test_the_config_path_is_resolved_at_call_time(site, tmp_path, monkeypatch):
    other_home = tmp_path / "other-home"
    other_home.mkdir()
    monkeypatch.setenv("HOME", str(other_home))
    result = run_cli("plugins", "enable", "demo", "--json")
    assert result.data["config_path"] == str(other_home / ".canarchy" / "config.toml")
    assert (other_home / ".canarchy" / "config.toml").is_file()


@pytest.mark.parametrize("name", ["", "bad\nname"])
def test_bad_names(site, name):
    result = run_cli("plugins", "enable", name, "--force", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_enabled_entry_points_are_the_hook_for_loading(site):
    (site / "demo_canarchy_plugin.py").write_text("class Decoder:\n    pass\n\nclass Processor:\n    pass\n")
    assert plugins.enabled_entry_points("canarchy.decoders") == []
    assert run_cli("plugins", "enable", "demo").code == 0
    [entry_point] = plugins.enabled_entry_points("canarchy.decoders")
    assert entry_point.load().__name__ == "Decoder"
    assert plugins.enabled_entry_points("canarchy.transports") == []
    with pytest.raises(ValueError):
        plugins.enabled_entry_points("canarchy.nope")
    sys.modules.pop("demo_canarchy_plugin", None)
