"""cudal2_rl.policy's --policy argument: a bad path or an unusable directory is an error naming it
(before transformers is asked, which would answer with a Hub-name parse error or a download try)."""
import pytest

from cudal2_rl.policy import is_builtin, resolve_policy


def test_missing_policy_path_is_named(tmp_path):
    for bad in (str(tmp_path / "nope"), "./nope", "~/nope-cudal2", "a/b/c"):
        with pytest.raises(ValueError, match="no such directory"):
            resolve_policy(bad, log=lambda *a: None)


def test_directory_without_a_model_is_named(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_policy(str(tmp_path), log=lambda *a: None)


def test_model_directory_and_hub_name_pass_through(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)     # resolve_policy sets it; restored after
    (tmp_path / "config.json").write_text("{}")
    assert resolve_policy(str(tmp_path), log=lambda *a: None) == str(tmp_path)
    assert resolve_policy("org/model", log=lambda *a: None) == "org/model"     # a Hub name


def test_is_builtin(tmp_path):
    assert is_builtin("builtin") and not is_builtin(str(tmp_path))
    (tmp_path / "recipe.json").write_text("{}")
    assert is_builtin(str(tmp_path))
