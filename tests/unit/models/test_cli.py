"""`zllm pull / ls / rm`: exit codes, stdout (data) and stderr (people) checked separately."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from zllm.cli.models import human_size, register


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setenv("ZLLM_DATA_DIR", str(tmp_path / "data"))
    app = typer.Typer()
    register(app)

    def run(*args: str):
        return CliRunner().invoke(app, list(args))

    return run


def test_pull_ls_rm(cli, tiny_model_dir, tmp_path):
    pulled = cli("pull", str(tiny_model_dir), "--name", "org/tiny")
    assert (pulled.exit_code, pulled.stdout) == (0, "")
    assert "pulled org/tiny (LlamaForCausalLM" in pulled.stderr
    assert (tmp_path / "data" / "models" / "org--tiny" / "zllm-manifest.json").is_file()

    again = cli("pull", str(tiny_model_dir), "--name", "org/tiny")
    assert (again.exit_code, again.stdout) == (0, "")
    assert "already in the store" in again.stderr

    table = cli("ls")
    assert (table.exit_code, table.stderr) == (0, "")
    header, row = table.stdout.splitlines()
    assert header.split() == ["NAME", "ARCHITECTURE", "FORMAT", "SIZE", "SOURCE", "ADDED"]
    assert row.split()[:4] == ["org/tiny", "LlamaForCausalLM", "safetensors", "float32"]
    assert f"dir:{tiny_model_dir.resolve()}" in row

    listed = cli("ls", "--json")
    assert (listed.exit_code, listed.stderr) == (0, "")
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "org/tiny" and entry["architecture"] == "LlamaForCausalLM"
    assert entry["path"] == str(tmp_path / "data" / "models" / "org--tiny")
    assert "files" not in entry and len(entry["sha256"]) == 64

    unconfirmed = cli("rm", "org/tiny")
    assert (unconfirmed.exit_code, unconfirmed.stdout) == (1, "")
    assert "hint: pass --yes" in unconfirmed.stderr

    removed = cli("rm", "org/tiny", "--yes")
    assert (removed.exit_code, removed.stdout, removed.stderr) == (0, "", "removed org/tiny\n")
    assert json.loads(cli("ls", "--json").stdout) == []


def test_pull_a_gguf_with_file_and_ls_shows_its_quantization(cli, q8_gguf, tmp_path, monkeypatch):
    folder = tmp_path / "lms" / "someone" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    (folder / "tiny-Q8_0.gguf").write_bytes(q8_gguf.read_bytes())
    (folder / "tiny-F32.gguf").write_bytes(q8_gguf.read_bytes())
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "lms"))

    ambiguous = cli("pull", "lmstudio:someone/Tiny-GGUF")
    assert ambiguous.exit_code == 1 and "hint: pull lmstudio:someone/Tiny-GGUF:QUANT" in ambiguous.stderr

    pulled = cli("pull", "lmstudio:someone/Tiny-GGUF", "--file", "tiny-Q8_0.gguf")
    assert (pulled.exit_code, pulled.stdout) == (0, "")
    assert "pulled someone/tiny-Q8_0 (LlamaForCausalLM, gguf Q8_0" in pulled.stderr

    header, row = cli("ls").stdout.splitlines()
    assert header.split()[:3] == ["NAME", "ARCHITECTURE", "FORMAT"]
    assert row.split()[:4] == ["someone/tiny-Q8_0", "LlamaForCausalLM", "gguf", "Q8_0"]
    [entry] = json.loads(cli("ls", "--json").stdout)
    assert (entry["weights_format"], entry["quantization"]) == ("gguf", "Q8_0")


def test_force_pulls_again(cli, tiny_model_dir):
    cli("pull", str(tiny_model_dir), "--name", "tiny")

    forced = cli("pull", str(tiny_model_dir), "--name", "tiny", "--force")

    assert forced.exit_code == 0 and "pulled tiny" in forced.stderr


def test_empty_store(cli):
    listed = cli("ls")
    assert (listed.exit_code, listed.stdout) == (0, "")
    assert "zllm pull smollm2" in listed.stderr
    assert cli("ls", "--json").stdout == "[]\n"


def test_errors_are_uv_style_on_stderr(cli, tiny_model_dir):
    missing = cli("rm", "nope", "--yes")
    assert (missing.exit_code, missing.stdout) == (1, "")
    assert missing.stderr.startswith("error: The model `nope` does not exist.\n")

    unknown = cli("pull", "what-is-this")
    assert (unknown.exit_code, unknown.stdout) == (1, "")
    assert unknown.stderr.startswith("error: `what-is-this` is not a model zllm knows how to pull")
    assert "hint: " in unknown.stderr

    bad_name = cli("pull", str(tiny_model_dir), "--name", "a--b")
    assert bad_name.exit_code == 1 and "not a valid model name" in bad_name.stderr


def test_unreachable_hub_is_an_error_with_the_cause(cli):
    result = cli("pull", "org/unreachable")

    assert (result.exit_code, result.stdout) == (1, "")
    assert "error: cannot reach http://127.0.0.1:9" in result.stderr
    assert "Caused by" in result.stderr and "hint:" in result.stderr


@pytest.mark.parametrize(
    "size, text", [(0, "0 B"), (999, "999 B"), (1_500, "1.5 KB"), (538_090_408, "538.1 MB"), (7 * 10**12, "7000.0 GB")]
)
def test_human_size(size, text):
    assert human_size(size) == text
