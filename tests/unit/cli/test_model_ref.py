"""-m classification (pure) and resolution (filesystem, Hub)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcel_trio.cli.model_ref import ModelRefError, refusal, resolve

from ._proc import run_cli


@pytest.mark.parametrize("value", [
    "model.gguf", "/models/Qwen3-8B-Q4_K_M.GGUF", "./x/y.gguf",
])
def test_gguf_files_are_refused(value: str) -> None:
    reason = refusal(value)
    assert reason and "GGUF" in reason and "config.json" in reason
    assert "mlx-community/Qwen3-0.6B-bf16" in reason


def test_split_shards_are_refused_as_shards() -> None:
    reason = refusal("big-model-00001-of-00003.gguf")
    assert reason and "split" in reason


@pytest.mark.parametrize("value", [
    "http://example.com/m.gguf", "https://example.com/model", "file:///srv/m",
    "s3://bucket/m", "hf://owner/name", "https://huggingface.co/owner/name",
])
def test_urls_are_refused(value: str) -> None:
    reason = refusal(value)
    assert reason and "URL" in reason


def test_hub_urls_point_at_the_repo_id() -> None:
    assert "use --model owner/name" in (refusal("https://huggingface.co/owner/name/tree/main") or "")
    assert "use --model owner/name" in (refusal("hf://owner/name") or "")


@pytest.mark.parametrize("value", ["owner/name", "/srv/ckpt", "ckpt", "./a.safetensors-dir"])
def test_plain_references_pass_classification(value: str) -> None:
    assert refusal(value) is None


def test_local_checkpoint_resolves(checkpoint: Path) -> None:
    got = resolve(str(checkpoint))
    assert got.source == "local" and got.path == str(checkpoint.resolve())


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelRefError, match="no config.json"):
        resolve(str(tmp_path))


def test_directory_without_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelRefError, match="safetensors"):
        resolve(str(tmp_path))


def test_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(ModelRefError, match="not a directory"):
        resolve(str(path))


def test_unknown_bare_name_is_refused() -> None:
    with pytest.raises(ModelRefError, match="not a Hugging Face repo id"):
        resolve("surely-not-a-local-dir-xyz")


def _fake_hub(monkeypatch: pytest.MonkeyPatch, download) -> None:  # type: ignore[no-untyped-def]
    from mlxcel_trio import downloads

    monkeypatch.setattr(downloads, "fetch", download)


def test_repo_id_resolves_through_the_download(
    monkeypatch: pytest.MonkeyPatch, checkpoint: Path
) -> None:
    seen = []

    def download(repo_id: str, **kwargs: object) -> Path:
        seen.append(repo_id)
        return checkpoint

    _fake_hub(monkeypatch, download)
    got = resolve("owner/name")
    assert seen == ["owner/name"] and got.source == "hub" and got.path == str(checkpoint)


def test_a_failed_download_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlxcel_trio.downloads import DownloadError, hub_failure

    def download(repo_id: str, **kwargs: object) -> Path:
        raise DownloadError(hub_failure(RuntimeError("500 Server Error\nsomething for url: x")))

    _fake_hub(monkeypatch, download)
    with pytest.raises(ModelRefError) as err:
        resolve("owner/name")
    assert str(err.value) == "could not fetch it from Hugging Face: RuntimeError: 500 Server Error"


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"{status} Client Error\nfor url: x")
        self.response = type("Response", (), {"status_code": status})()


@pytest.mark.parametrize(("status", "needle"), [
    (401, "401 Unauthorized: the repository is private or gated; pass --hf-token"),
    (404, "404 Not Found: no such repository"), (503, "HTTP 503: 503 Client Error")])
def test_hub_http_status_is_named(status: int, needle: str) -> None:
    from mlxcel_trio.downloads import hub_failure

    line = hub_failure(_HttpError(status))
    assert needle in line and "\n" not in line


def test_an_unreachable_hub_is_not_called_offline() -> None:
    from mlxcel_trio.downloads import hub_failure

    line = hub_failure(ConnectionError("Name or service not known"))
    assert "HF_HUB_OFFLINE" not in line
    assert line.endswith("ConnectionError: Name or service not known")


def test_hub_snapshot_that_is_not_mlx_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_hub(monkeypatch, lambda repo_id, **kw: tmp_path)
    with pytest.raises(ModelRefError, match="owner/name has no config.json"):
        resolve("owner/name")


def test_offline_and_uncached_is_one_line(tmp_path: Path) -> None:
    run = run_cli(["-m", "nobody-xyz/not-cached"], HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    assert run.rc == 1 and len(run.stderr_lines) == 1
    assert "HF_HUB_OFFLINE" in run.stderr and "--model 'nobody-xyz/not-cached'" in run.stderr

