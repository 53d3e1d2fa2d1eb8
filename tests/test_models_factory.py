"""``--model`` specs: the offline default, providers with their keys, clear errors, start-up check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from companion.models.base import StatesRequest
from companion.models.errors import ModelSetupError
from companion.models.factory import MODEL_SPEC_FORMS, check_model, make_model
from companion.models.providers import LOCAL_PLACEHOLDER_KEY, ProviderModel
from companion.models.scripted import ScriptedModel
from companion.protocol import Message
from support.cards import metadata as md
from support.fake_llm_server import PROFILES, free_port, running_server, tool_call


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from an environment without provider keys or base URLs."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def provider(spec: str, **kwargs: object) -> ProviderModel:
    model = make_model(spec, **kwargs)  # type: ignore[arg-type]
    assert isinstance(model, ProviderModel)
    return model


def test_scripted_is_the_offline_model_with_the_given_seed() -> None:
    model = make_model("scripted", seed=5)
    assert isinstance(model, ScriptedModel) and model.seed == 5
    seeded = make_model("scripted:42", seed=5)
    assert isinstance(seeded, ScriptedModel) and seeded.seed == 42
    assert make_model(" scripted:-3 ").name == "scripted(seed=-3)"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("gpt-4o", "unknown kind"),
        ("ollama:llama3", "unknown kind"),
        ("", "empty"),
        ("scripted:abc", "the seed 'abc' is not an integer"),
        ("openai:", "no model name after 'openai:'"),
        ("anthropic:  ", "no model name after 'anthropic:'"),
    ],
)
def test_bad_specs_list_the_valid_forms(spec: str, why: str) -> None:
    with pytest.raises(ModelSetupError) as caught:
        make_model(spec)
    message = str(caught.value)
    assert why in message
    for form in MODEL_SPEC_FORMS:
        assert form in message


def test_openai_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelSetupError, match="OPENAI_API_KEY is not set"):
        make_model("openai:gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live")
    model = provider("openai:gpt-4o-mini")
    assert model.name == "openai:gpt-4o-mini"
    assert model.config.api_key == "sk-live" and model.config.base_url is None
    assert "sk-live" not in repr(model) and "sk-live" not in repr(model.config)


def test_anthropic_needs_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    with pytest.raises(ModelSetupError, match="ANTHROPIC_API_KEY is not set"):
        make_model("anthropic:claude-sonnet-4-5")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    model = provider("anthropic:claude-sonnet-4-5")
    assert (model.config.kind, model.config.api_key) == ("anthropic", "sk-ant")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.53"])
def test_a_local_endpoint_needs_no_key(host: str) -> None:
    model = provider("openai:llama3.2", base_url=f"http://{host}:11434/v1")
    assert model.config.api_key == LOCAL_PLACEHOLDER_KEY


def test_a_remote_endpoint_without_a_key_is_refused() -> None:
    with pytest.raises(ModelSetupError, match=r"https://llm\.example\.org/v1 is not on this machine"):
        make_model("openai:llama3", base_url="https://llm.example.org/v1")


def test_a_set_key_is_sent_to_a_local_endpoint_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "vllm-secret")
    assert provider("openai:m", base_url="http://127.0.0.1:8000/v1").config.api_key == "vllm-secret"


def test_openai_base_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
    model = provider("openai:local")
    assert model.config.base_url == "http://127.0.0.1:8080/v1"
    explicit = provider("openai:local", base_url="http://127.0.0.1:9999/v1")
    assert explicit.config.base_url == "http://127.0.0.1:9999/v1"


@pytest.mark.parametrize("url", ["127.0.0.1:11434/v1", "ftp://127.0.0.1/v1", "http://"])
def test_a_malformed_base_url_is_refused(url: str) -> None:
    with pytest.raises(ModelSetupError, match="is not an http"):
        make_model("openai:m", base_url=url)


def test_the_timeout_is_per_request_and_positive() -> None:
    assert provider("openai:m", base_url="http://127.0.0.1:1/v1", timeout=7.5).config.request_timeout == 7.5
    with pytest.raises(ModelSetupError, match="must be positive"):
        make_model("openai:m", base_url="http://127.0.0.1:1/v1", timeout=0)


def test_missing_provider_packages_say_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "companion.models.providers", None)
    with pytest.raises(ModelSetupError, match=r"pip install 'companion\[providers\]'"):
        make_model("openai:m", base_url="http://127.0.0.1:1/v1")
    assert isinstance(make_model("scripted"), ScriptedModel)


async def test_check_model_needs_no_network_for_the_scripted_model() -> None:
    await check_model(make_model("scripted"))


async def test_check_model_fails_at_start_up_for_an_unreachable_endpoint() -> None:
    model = make_model("openai:llama3.2", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(ModelSetupError, match="cannot reach"):
        await check_model(model, timeout=5)


async def test_a_spec_to_a_local_server_end_to_end() -> None:
    """What ``--model openai:NAME --base-url ...`` does against a local OpenAI-compatible server."""
    aya = md("aya", name="Aya", personality="kind", sample="Hi")
    opening = Message.create("user_1", [aya.id], "Hello Aya!")
    with running_server(models=("qwen2.5:3b",)) as srv:
        model = make_model("openai:qwen2.5:3b", base_url=srv.openai_base_url)
        await check_model(model)
        srv.push(
            tool_call(
                "set_states",
                {"speak": [7], "selected": [aya.id]},
            )
        )
        [decision] = await model.decide_states(
            StatesRequest(message=opening, companions=[aya], history=[opening])
        )
        assert (decision.state, decision.selected) == ("speak", True)
        listing, generation = srv.requests
        assert (listing.path, generation.path) == ("/v1/models", "/v1/chat/completions")
        assert generation.body["model"] == "qwen2.5:3b"
        assert generation.headers["authorization"] == f"Bearer {LOCAL_PLACEHOLDER_KEY}"


async def test_check_model_shows_its_progress_with_seconds() -> None:
    """A long set-up says when it starts and when it is ready, naming the server it found."""
    lines: list[str] = []
    with running_server(models=("smollm2",), profile=PROFILES["llama-cpp-python"]) as srv:
        await check_model(make_model("openai:smollm2", base_url=srv.openai_base_url), progress=lines.append)
    assert lines[0] == f"checking openai:smollm2 at {srv.openai_base_url} …"
    assert re.fullmatch(r"openai:smollm2 ready \(llama-cpp-python\) in \d+\.\d s", lines[1]), lines


async def test_check_model_failure_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ModelSetupError):
        await check_model(make_model("openai:llama3.2", base_url=url), timeout=5)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"companion: checking openai:llama3.2 at {url} …"
    assert re.fullmatch(
        rf"companion: openai:llama3\.2: failed after \d+\.\d s: "
        rf"cannot reach {re.escape(url)}; is the server running\?",
        err[1],
    ), err


def test_companion_run_says_an_unreachable_model_once(tmp_path: Path) -> None:
    """The check's own line names the fault; the command adds no second or third copy of it
    (it printed the same reason three times: the progress line, a log line, an error line)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    card = Path(__file__).resolve().parent.parent / "companion" / "cards" / "pim.yaml"
    command = [sys.executable, "-m", "companion", "run", str(card), "--model", "openai:smol"]
    command += ["--base-url", url, "--data-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("cannot reach") == 1, done.stderr
    assert done.stderr.splitlines()[-1].startswith("companion: openai:smol: failed after"), done.stderr


def test_timings_for_the_scripted_model_need_no_provider_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel installed without the ``providers`` extra runs the offline demo: choosing the
    engine's deadlines must not import pydantic-ai's side (it did: ``No module named 'httpx2'``)."""
    from companion.models.factory import engine_timings
    from companion.timings import EngineTimings

    monkeypatch.setitem(sys.modules, "companion.models.providers", None)  # import raises ImportError
    assert engine_timings([ScriptedModel(0)]) == EngineTimings.offline()
