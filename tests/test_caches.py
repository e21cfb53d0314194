"""`dbc cache list`, `dbc cache prune`, `skills cache list` (canarchy.dbc_cache, canarchy.skills_cache).

Caches are built by writing manifests under the module roots, read at test
time (``dbc_cache._CACHE_ROOT``): the hermetic plugin points them into the
per-test home. Tests about a custom root re-point them with monkeypatch.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from canarchy import dbc_cache, skills_cache
from canarchy.cli import main

SHA_ZERO = "0" * 64
OLD = "1111111111111111111111111111111111111111"
CUR = "2222222222222222222222222222222222222222"


def run(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = main([*argv, "--json"], stdout=out)
    return code, json.loads(out.getvalue())


def write_provider(root: Path, provider: str, commit: str, contents: dict[str, bytes] | None = None,
                   overrides: dict[str, Any] | None = None) -> Path:
    """Write ``providers/<provider>/manifest.json`` and ``contents`` under ``files/<commit>/``;
    ``overrides`` replaces manifest keys (to make it invalid)."""
    provider_dir = root / "providers" / provider
    files_dir = provider_dir / "files" / commit
    files_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for rel, content in (contents or {}).items():
        target = files_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        entries.append({"path": rel, "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)})
    manifest = {
        "provider": provider,
        "repository": f"https://example.invalid/{provider}",
        "commit": commit,
        "fetched_at": "2026-01-31T12:00:00Z",
        "files": entries,
    }
    manifest.update(overrides or {})
    (provider_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return provider_dir


def write_stale(provider_dir: Path, commit: str, files: dict[str, bytes]) -> Path:
    stale = provider_dir / "files" / commit
    for rel, content in files.items():
        (stale / rel).parent.mkdir(parents=True, exist_ok=True)
        (stale / rel).write_bytes(content)
    return stale


def warnings_with(envelope: dict[str, Any], code: str) -> list[str]:
    return [w for w in envelope["warnings"] if w.startswith(code + ":")]


# --- dbc cache list ---------------------------------------------------------------------------------


def test_dbc_list_missing_root_lists_zero_providers():
    root = dbc_cache._CACHE_ROOT
    assert not root.exists()
    code, env = run("dbc", "cache", "list")
    assert code == 0 and env["ok"] is True
    assert env["command"] == "dbc cache list"
    assert env["data"]["providers"] == [] and env["data"]["provider_count"] == 0
    assert env["data"]["cache_root"] == str(root)
    assert env["warnings"] == []


def test_dbc_list_empty_root_lists_zero_providers():
    (dbc_cache._CACHE_ROOT / "providers").mkdir(parents=True)
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["provider_count"] == 0


def test_dbc_list_reports_provider_and_files():
    root = dbc_cache._CACHE_ROOT
    write_provider(root, "opendbc", CUR, {"toyota_prius_2010_pt.dbc": b"VERSION \"\"\n" * 10, "sub/x.dbc": b"BO_ 1"})
    code, env = run("dbc", "cache", "list")
    assert code == 0, env
    data = env["data"]
    assert data["provider_count"] == 1
    (provider,) = data["providers"]
    assert provider["provider"] == "opendbc"
    assert provider["commit"] == CUR
    assert provider["fetched_at"] == "2026-01-31T12:00:00Z"
    assert provider["repository"] == "https://example.invalid/opendbc"
    assert provider["file_count"] == 2
    assert provider["bytes"] == 110 + 5
    assert [f["path"] for f in provider["files"]] == ["toyota_prius_2010_pt.dbc", "sub/x.dbc"]
    assert all(f["present"] for f in provider["files"])
    assert provider["files"][1]["sha256"] == hashlib.sha256(b"BO_ 1").hexdigest()


def test_dbc_list_marks_missing_file_not_present():
    provider_dir = write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR, {"a.dbc": b"x"})
    (provider_dir / "files" / CUR / "a.dbc").unlink()
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["providers"][0]["files"][0]["present"] is False


def test_dbc_list_providers_sorted_and_dot_dirs_ignored():
    root = dbc_cache._CACHE_ROOT
    write_provider(root, "zeta", CUR)
    write_provider(root, "alpha", CUR)
    (root / "providers" / ".partial-download").mkdir()
    _code, env = run("dbc", "cache", "list")
    assert [p["provider"] for p in env["data"]["providers"]] == ["alpha", "zeta"]
    assert env["warnings"] == []


def test_dbc_list_reads_root_at_call_time(tmp_path, monkeypatch):
    custom = tmp_path / "custom-dbc"
    monkeypatch.setattr(dbc_cache, "_CACHE_ROOT", custom)
    write_provider(custom, "vendor", CUR, {"v.dbc": b"abc"})
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["cache_root"] == str(custom)
    assert [p["provider"] for p in env["data"]["providers"]] == ["vendor"]


def test_dbc_list_malformed_manifest_is_a_warning_naming_the_file():
    root = dbc_cache._CACHE_ROOT
    write_provider(root, "good", CUR, {"g.dbc": b"g"})
    bad_dir = root / "providers" / "broken"
    bad_dir.mkdir(parents=True)
    (bad_dir / "manifest.json").write_text("{not json", encoding="utf-8")
    code, env = run("dbc", "cache", "list")
    assert code == 0 and env["ok"] is True
    assert [p["provider"] for p in env["data"]["providers"]] == ["good"]
    (warning,) = warnings_with(env, "DBC_MANIFEST_INVALID")
    assert str(bad_dir / "manifest.json") in warning


def test_dbc_list_provider_without_manifest_is_a_warning():
    root = dbc_cache._CACHE_ROOT
    (root / "providers" / "empty").mkdir(parents=True)
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["provider_count"] == 0
    (warning,) = warnings_with(env, "DBC_MANIFEST_INVALID")
    assert "no manifest.json" in warning


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"commit": "../escape"}, "'commit'"),
        ({"commit": ".hidden"}, "'commit'"),
        ({"provider": "other"}, "'provider'"),
        ({"fetched_at": "yesterday"}, "'fetched_at'"),
        ({"fetched_at": 20260131}, "'fetched_at'"),
        ({"files": {"a": 1}}, "'files'"),
        ({"repository": 7}, "'repository'"),
        ({"files": [{"path": "a.dbc", "sha256": "XYZ", "bytes": 1}]}, "sha256"),
        ({"files": [{"path": "a.dbc", "sha256": SHA_ZERO, "bytes": -1}]}, "bytes"),
        ({"files": [{"path": "a.dbc", "sha256": SHA_ZERO, "bytes": True}]}, "bytes"),
        ({"files": [{"path": "", "sha256": SHA_ZERO, "bytes": 1}]}, "path"),
        ({"files": ["a.dbc"]}, "files[0]"),
        ({"files": [{"path": "a.dbc", "sha256": SHA_ZERO, "bytes": 1}] * 2}, "twice"),
    ],
)
def test_dbc_list_rejects_invalid_manifest_fields(overrides, reason):
    write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR, overrides=overrides)
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["provider_count"] == 0
    (warning,) = warnings_with(env, "DBC_MANIFEST_INVALID")
    assert reason in warning


def test_dbc_list_manifest_missing_key_and_non_object():
    root = dbc_cache._CACHE_ROOT
    first = write_provider(root, "nocommit", CUR)
    document = json.loads((first / "manifest.json").read_text())
    del document["commit"]
    (first / "manifest.json").write_text(json.dumps(document))
    second = root / "providers" / "listy"
    second.mkdir(parents=True)
    (second / "manifest.json").write_text("[1, 2]")
    code, env = run("dbc", "cache", "list")
    assert code == 0
    found = warnings_with(env, "DBC_MANIFEST_INVALID")
    assert len(found) == 2
    assert any("missing key 'commit'" in w for w in found)
    assert any("expected a JSON object" in w for w in found)


def test_dbc_list_refuses_entries_escaping_the_root(tmp_path):
    root = dbc_cache._CACHE_ROOT
    outside = tmp_path / "outside.dbc"
    outside.write_bytes(b"secret")
    entries = [
        {"path": "ok.dbc", "sha256": SHA_ZERO, "bytes": 2},
        {"path": "../../../../etc/passwd", "sha256": SHA_ZERO, "bytes": 1},
        {"path": str(outside), "sha256": SHA_ZERO, "bytes": 6},
    ]
    provider_dir = write_provider(root, "opendbc", CUR)
    document = json.loads((provider_dir / "manifest.json").read_text())
    document["files"] = entries
    (provider_dir / "manifest.json").write_text(json.dumps(document))
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert [f["path"] for f in env["data"]["providers"][0]["files"]] == ["ok.dbc"]
    assert env["data"]["providers"][0]["bytes"] == 2
    assert len(warnings_with(env, "DBC_CACHE_PATH_ESCAPE")) == 2


def test_dbc_list_default_provider_from_config():
    config = dbc_cache._CONFIG_PATH
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[dbc_cache]\ndefault_provider = "opendbc"\n', encoding="utf-8")
    code, env = run("dbc", "cache", "list")
    assert code == 0
    assert env["data"]["default_provider"] == "opendbc"


def test_dbc_list_reads_config_path_at_call_time(tmp_path, monkeypatch):
    config = tmp_path / "elsewhere.toml"
    config.write_text('[dbc_cache]\ndefault_provider = "vendor"\n', encoding="utf-8")
    monkeypatch.setattr(dbc_cache, "_CONFIG_PATH", config)
    _code, env = run("dbc", "cache", "list")
    assert env["data"]["default_provider"] == "vendor"


def test_dbc_list_without_config_has_no_default_provider():
    code, env = run("dbc", "cache", "list")
    assert code == 0 and env["data"]["default_provider"] is None


@pytest.mark.parametrize(
    "text",
    ['[dbc_cache\n', 'dbc_cache = 3\n', '[dbc_cache]\ndefault_provider = "../x"\n',
     '[dbc_cache]\ndefault_provider = 5\n'],
)
def test_dbc_list_invalid_config_is_config_invalid(text):
    config = dbc_cache._CONFIG_PATH
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text, encoding="utf-8")
    code, env = run("dbc", "cache", "list")
    assert code == 1 and env["ok"] is False
    (error,) = env["errors"]
    assert error["code"] == "CONFIG_INVALID"
    assert str(config) in error["message"] and error["hint"]


def test_dbc_list_text_output():
    write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR, {"a.dbc": b"abc"})
    out = io.StringIO()
    assert main(["dbc", "cache", "list"], stdout=out) == 0
    text = out.getvalue()
    assert "opendbc" in text and "a.dbc" in text and "providers: 1" in text


@pytest.mark.parametrize(
    "argv",
    [["dbc", "cache", "list", "extra"], ["dbc", "cache"], ["dbc", "cache", "bogus"], ["dbc"],
     ["skills", "cache", "list", "--provider", "x"], ["skills", "cache"]],
)
def test_cache_commands_reject_bad_arguments(argv):
    code, env = run(*argv)
    assert code == 1
    assert env["errors"][0]["code"] == "INVALID_ARGUMENTS"


# --- dbc cache prune --------------------------------------------------------------------------------


def test_dbc_prune_removes_stale_commits_and_keeps_current():
    root = dbc_cache._CACHE_ROOT
    provider_dir = write_provider(root, "opendbc", CUR, {"a.dbc": b"current"})
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"12345", "nested/b.dbc": b"123"})
    stray = provider_dir / "files" / "stray.tmp"
    stray.write_bytes(b"12")
    code, env = run("dbc", "cache", "prune")
    assert code == 0, env
    assert env["command"] == "dbc cache prune"
    data = env["data"]
    assert sorted(data["removed"]) == sorted([str(stale), str(stray)])
    assert data["removed_count"] == 2
    assert data["bytes_freed"] == 5 + 3 + 2
    assert data["provider"] is None
    assert not stale.exists() and not stray.exists()
    assert (provider_dir / "files" / CUR / "a.dbc").read_bytes() == b"current"
    assert (provider_dir / "manifest.json").exists()


def test_dbc_prune_with_nothing_stale_removes_nothing():
    write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR, {"a.dbc": b"x"})
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed"] == [] and env["data"]["removed_count"] == 0 and env["data"]["bytes_freed"] == 0


def test_dbc_prune_missing_root_removes_nothing():
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed_count"] == 0
    assert not dbc_cache._CACHE_ROOT.exists()


def test_dbc_prune_provider_limits_to_that_provider():
    root = dbc_cache._CACHE_ROOT
    first = write_provider(root, "opendbc", CUR)
    second = write_provider(root, "vendor", CUR)
    first_stale = write_stale(first, OLD, {"a.dbc": b"1"})
    second_stale = write_stale(second, OLD, {"a.dbc": b"1"})
    code, env = run("dbc", "cache", "prune", "--provider", "vendor")
    assert code == 0
    assert env["data"]["removed"] == [str(second_stale)]
    assert env["data"]["provider"] == "vendor"
    assert first_stale.exists() and not second_stale.exists()


def test_dbc_prune_unknown_provider_is_not_found():
    write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR)
    code, env = run("dbc", "cache", "prune", "--provider", "nope")
    assert code == 1 and env["ok"] is False
    (error,) = env["errors"]
    assert error["code"] == "DBC_PROVIDER_NOT_FOUND"
    assert "nope" in error["message"] and "dbc cache list" in error["hint"]


def test_dbc_prune_unknown_provider_on_missing_root_is_not_found():
    code, env = run("dbc", "cache", "prune", "--provider", "opendbc")
    assert code == 1
    assert env["errors"][0]["code"] == "DBC_PROVIDER_NOT_FOUND"


@pytest.mark.parametrize("name", ["../dbc", "..", ".", "a/b", "/tmp", ".hidden", ""])
def test_dbc_prune_rejects_provider_names_that_are_paths(name):
    root = dbc_cache._CACHE_ROOT
    provider_dir = write_provider(root, "opendbc", CUR)
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"1"})
    code, env = run("dbc", "cache", "prune", "--provider", name)
    assert code == 1
    assert env["errors"][0]["code"] == "INVALID_PROVIDER_NAME"
    assert stale.exists()


def test_dbc_prune_provider_with_malformed_manifest_is_a_decode_error():
    root = dbc_cache._CACHE_ROOT
    provider_dir = write_provider(root, "opendbc", CUR)
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"1"})
    (provider_dir / "manifest.json").write_text("{", encoding="utf-8")
    code, env = run("dbc", "cache", "prune", "--provider", "opendbc")
    assert code == 3
    (error,) = env["errors"]
    assert error["code"] == "DBC_MANIFEST_INVALID"
    assert str(provider_dir / "manifest.json") in error["message"]
    assert stale.exists() and (provider_dir / "files" / CUR).exists()


def test_dbc_prune_all_skips_malformed_provider_with_warning():
    root = dbc_cache._CACHE_ROOT
    broken = write_provider(root, "broken", CUR)
    broken_stale = write_stale(broken, OLD, {"a.dbc": b"1"})
    (broken / "manifest.json").write_text('{"provider": "broken"}', encoding="utf-8")
    good = write_provider(root, "good", CUR)
    good_stale = write_stale(good, OLD, {"a.dbc": b"1"})
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed"] == [str(good_stale)]
    assert broken_stale.exists() and not good_stale.exists()
    (warning,) = warnings_with(env, "DBC_MANIFEST_INVALID")
    assert str(broken / "manifest.json") in warning


def test_dbc_prune_never_follows_a_commit_symlink_out_of_the_root(tmp_path):
    root = dbc_cache._CACHE_ROOT
    provider_dir = write_provider(root, "opendbc", CUR)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_bytes(b"keep me")
    link = provider_dir / "files" / OLD
    link.symlink_to(victim, target_is_directory=True)
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed"] == []
    assert (victim / "precious.txt").read_bytes() == b"keep me"
    assert link.is_symlink()
    (warning,) = warnings_with(env, "DBC_CACHE_PATH_ESCAPE")
    assert str(link) in warning


def test_dbc_prune_unlinks_symlinks_inside_a_stale_commit_without_following(tmp_path):
    root = dbc_cache._CACHE_ROOT
    provider_dir = write_provider(root, "opendbc", CUR)
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"1234"})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_bytes(b"keep me")
    (stale / "dirlink").symlink_to(victim, target_is_directory=True)
    (stale / "filelink").symlink_to(victim / "precious.txt")
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed"] == [str(stale)]
    assert env["data"]["bytes_freed"] == 4
    assert not stale.exists()
    assert (victim / "precious.txt").read_bytes() == b"keep me"


def test_dbc_prune_refuses_a_provider_directory_linked_outside(tmp_path):
    root = dbc_cache._CACHE_ROOT
    elsewhere = tmp_path / "elsewhere"
    real_provider = write_provider(elsewhere, "opendbc", CUR)
    outside_stale = write_stale(real_provider, OLD, {"a.dbc": b"1"})
    (root / "providers").mkdir(parents=True)
    (root / "providers" / "opendbc").symlink_to(real_provider, target_is_directory=True)
    for argv in (["dbc", "cache", "prune"], ["dbc", "cache", "prune", "--provider", "opendbc"]):
        code, env = run(*argv)
        assert code == 0
        assert env["data"]["removed"] == []
        assert warnings_with(env, "DBC_CACHE_PATH_ESCAPE")
    assert outside_stale.exists()


def test_dbc_prune_follows_a_symlinked_cache_root(tmp_path, monkeypatch):
    # The root itself may be a link (cache on another disk): pruning inside it is fine.
    real_root = tmp_path / "real-root"
    provider_dir = write_provider(real_root, "opendbc", CUR)
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"1"})
    link_root = tmp_path / "link-root"
    link_root.symlink_to(real_root, target_is_directory=True)
    monkeypatch.setattr(dbc_cache, "_CACHE_ROOT", link_root)
    code, env = run("dbc", "cache", "prune")
    assert code == 0
    assert env["data"]["removed_count"] == 1
    assert not stale.exists()


def test_dbc_prune_text_output():
    provider_dir = write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR)
    stale = write_stale(provider_dir, OLD, {"a.dbc": b"123"})
    out = io.StringIO()
    assert main(["dbc", "cache", "prune"], stdout=out) == 0
    assert "removed: 1 (3 bytes freed)" in out.getvalue()
    assert str(stale) in out.getvalue()


def test_dbc_prune_missing_provider_value_is_invalid_arguments():
    code, env = run("dbc", "cache", "prune", "--provider")
    assert code == 1 and env["errors"][0]["code"] == "INVALID_ARGUMENTS"


# --- skills cache list ------------------------------------------------------------------------------


def test_skills_list_missing_root_lists_zero_providers():
    code, env = run("skills", "cache", "list")
    assert code == 0
    assert env["command"] == "skills cache list"
    assert env["data"]["provider_count"] == 0 and env["data"]["providers"] == []
    assert env["data"]["cache_root"] == str(skills_cache._CACHE_ROOT)


def test_skills_list_reports_provider():
    write_provider(skills_cache._CACHE_ROOT, "canarchy-skills", CUR, {"uds/triage.md": b"# triage\n"})
    code, env = run("skills", "cache", "list")
    assert code == 0
    (provider,) = env["data"]["providers"]
    assert provider["provider"] == "canarchy-skills"
    assert provider["files"] == [{
        "path": "uds/triage.md", "sha256": hashlib.sha256(b"# triage\n").hexdigest(), "bytes": 9, "present": True,
    }]


def test_skills_list_is_separate_from_dbc_cache():
    write_provider(dbc_cache._CACHE_ROOT, "opendbc", CUR)
    _code, env = run("skills", "cache", "list")
    assert env["data"]["provider_count"] == 0


def test_skills_list_reads_root_at_call_time(tmp_path, monkeypatch):
    custom = tmp_path / "skills-root"
    monkeypatch.setattr(skills_cache, "_CACHE_ROOT", custom)
    write_provider(custom, "mine", CUR)
    _code, env = run("skills", "cache", "list")
    assert env["data"]["cache_root"] == str(custom)
    assert [p["provider"] for p in env["data"]["providers"]] == ["mine"]


@pytest.mark.parametrize("entry", ["../../x", "../../../../../../etc/passwd", "/etc/passwd", "a/../../b",
                                   "..\\..\\x", "C:/x"])
def test_skills_list_refuses_paths_escaping_the_root(entry):
    root = skills_cache._CACHE_ROOT
    provider_dir = write_provider(root, "canarchy-skills", CUR, {"ok.md": b"ok"})
    document = json.loads((provider_dir / "manifest.json").read_text())
    document["files"].append({"path": entry, "sha256": SHA_ZERO, "bytes": 1})
    (provider_dir / "manifest.json").write_text(json.dumps(document))
    code, env = run("skills", "cache", "list")
    assert code == 0 and env["ok"] is True
    (provider,) = env["data"]["providers"]
    assert [f["path"] for f in provider["files"]] == ["ok.md"]
    assert provider["file_count"] == 1
    (warning,) = warnings_with(env, "SKILLS_CACHE_PATH_ESCAPE")
    assert repr(entry) in warning


def test_skills_list_refuses_symlink_escaping_the_root(tmp_path):
    root = skills_cache._CACHE_ROOT
    secret = tmp_path / "secret.md"
    secret.write_bytes(b"secret")
    provider_dir = write_provider(root, "canarchy-skills", CUR, {"ok.md": b"ok"})
    (provider_dir / "files" / CUR / "leak.md").symlink_to(secret)
    document = json.loads((provider_dir / "manifest.json").read_text())
    document["files"].append({"path": "leak.md", "sha256": SHA_ZERO, "bytes": 6})
    (provider_dir / "manifest.json").write_text(json.dumps(document))
    code, env = run("skills", "cache", "list")
    assert code == 0
    assert [f["path"] for f in env["data"]["providers"][0]["files"]] == ["ok.md"]
    (warning,) = warnings_with(env, "SKILLS_CACHE_PATH_ESCAPE")
    assert "'leak.md'" in warning and str(secret) in warning


def test_skills_list_allows_symlink_staying_inside_the_root():
    root = skills_cache._CACHE_ROOT
    provider_dir = write_provider(root, "canarchy-skills", CUR, {"real.md": b"real"})
    (provider_dir / "files" / CUR / "alias.md").symlink_to(provider_dir / "files" / CUR / "real.md")
    document = json.loads((provider_dir / "manifest.json").read_text())
    document["files"].append({"path": "alias.md", "sha256": SHA_ZERO, "bytes": 4})
    (provider_dir / "manifest.json").write_text(json.dumps(document))
    _code, env = run("skills", "cache", "list")
    assert [f["path"] for f in env["data"]["providers"][0]["files"]] == ["real.md", "alias.md"]
    assert env["warnings"] == []


def test_skills_list_refuses_provider_directory_linked_outside(tmp_path):
    root = skills_cache._CACHE_ROOT
    real_provider = write_provider(tmp_path / "elsewhere", "evil", CUR, {"x.md": b"x"})
    (root / "providers").mkdir(parents=True)
    (root / "providers" / "evil").symlink_to(real_provider, target_is_directory=True)
    code, env = run("skills", "cache", "list")
    assert code == 0
    assert env["data"]["provider_count"] == 0
    (warning,) = warnings_with(env, "SKILLS_CACHE_PATH_ESCAPE")
    assert "evil" in warning


def test_skills_list_malformed_manifest_is_a_warning():
    root = skills_cache._CACHE_ROOT
    write_provider(root, "good", CUR)
    bad = root / "providers" / "bad"
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_bytes(b"\xff\xfe not utf-8")
    code, env = run("skills", "cache", "list")
    assert code == 0
    assert [p["provider"] for p in env["data"]["providers"]] == ["good"]
    (warning,) = warnings_with(env, "SKILLS_MANIFEST_INVALID")
    assert str(bad / "manifest.json") in warning


def test_skills_list_default_provider_from_its_own_table():
    config = skills_cache._CONFIG_PATH
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[dbc_cache]\ndefault_provider = "opendbc"\n[skills_cache]\ndefault_provider = "mine"\n')
    _code, env = run("skills", "cache", "list")
    assert env["data"]["default_provider"] == "mine"


def test_skills_list_invalid_config_is_config_invalid(tmp_path, monkeypatch):
    config = tmp_path / "bad.toml"
    config.write_text("[skills_cache]\ndefault_provider = [1]\n")
    monkeypatch.setattr(skills_cache, "_CONFIG_PATH", config)
    code, env = run("skills", "cache", "list")
    assert code == 1 and env["errors"][0]["code"] == "CONFIG_INVALID"


# --- module attributes -----------------------------------------------------------------------------


def test_module_constants_have_the_documented_shape():
    # The harness re-points these; whatever home they use, the tail is fixed.
    assert dbc_cache._CACHE_ROOT.parts[-3:] == (".canarchy", "cache", "dbc")
    assert skills_cache._CACHE_ROOT.parts[-3:] == (".canarchy", "cache", "skills")
    assert dbc_cache._CONFIG_PATH.parts[-2:] == (".canarchy", "config.toml")
    assert skills_cache._CONFIG_PATH.parts[-2:] == (".canarchy", "config.toml")


def test_cache_modules_do_not_import_python_can():
    import subprocess
    import sys

    code = ("import sys, canarchy.dbc_cache, canarchy.skills_cache, canarchy.commands.caches; "
            "print('can' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
