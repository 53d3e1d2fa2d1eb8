"""Voice synthesis: the WAV reader, voice choice, and espeak-ng with its deadline and cancellation."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest
import trio

from companion.voice import (
    EspeakSynthesizer,
    Speech,
    SynthesisError,
    WavError,
    parse_wav,
    pick_voice,
)
from support.clients import needs_espeak


def _wav(pcm: bytes, rate: int = 22050, channels: int = 1, bits: int = 16, streaming: bool = False) -> bytes:
    size = 0x7FFFFFF0 if streaming else len(pcm)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * bits // 8, channels * bits // 8, bits)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + size if not streaming else size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", size)
        + pcm
    )


def test_parse_wav_reads_fixed_size_header() -> None:
    pcm = struct.pack("<4h", 0, 1000, -1000, 32767)
    speech = parse_wav(_wav(pcm, rate=16000))
    assert speech == Speech(pcm=pcm, sample_rate=16000)
    assert speech.samples == 4
    assert speech.duration == pytest.approx(4 / 16000)


def test_parse_wav_reads_streaming_placeholder_sizes() -> None:
    pcm = bytes(range(200))
    speech = parse_wav(_wav(pcm, streaming=True) + b"\x01")  # odd trailing byte dropped
    assert speech.pcm == pcm
    assert speech.sample_rate == 22050


def test_parse_wav_skips_unknown_chunks() -> None:
    data = _wav(b"\x01\x00\x02\x00")
    # insert a LIST chunk (odd size, padded) between fmt and data
    extra = b"LIST" + struct.pack("<I", 3) + b"abc\x00"
    data = data[:36] + extra + data[36:]
    assert parse_wav(data).pcm == b"\x01\x00\x02\x00"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "RIFF"),
        (b"RIFF\x00\x00\x00\x00WAVX", "RIFF"),
        (_wav(b"", channels=2), "mono"),
        (_wav(b"", bits=8), "16-bit"),
        (b"RIFF\x04\x00\x00\x00WAVE", "no data"),
        (b"RIFF\x0c\x00\x00\x00WAVEdata\x00\x00\x00\x00", "before fmt"),
    ],
)
def test_parse_wav_refuses_other_formats(data: bytes, why: str) -> None:
    with pytest.raises(WavError, match=why):
        parse_wav(data)


def test_speech_validates_its_samples() -> None:
    with pytest.raises(ValueError, match="whole"):
        Speech(pcm=b"\x00", sample_rate=8000)
    with pytest.raises(ValueError, match="positive"):
        Speech(pcm=b"", sample_rate=0)


def test_pick_voice_follows_the_script() -> None:
    assert pick_voice("こんにちは") == "ja"
    assert pick_voice("今日は晴れ") == "ja"
    assert pick_voice("안녕하세요") == "ko"
    assert pick_voice("Hello", default="de") == "de"


def test_command_passes_text_on_stdin_only() -> None:
    synth = EspeakSynthesizer(voice="en-us")
    argv = synth.command("-w /tmp/evil.wav", emotion="happy")
    assert "-w /tmp/evil.wav" not in argv
    assert argv[argv.index("-v") + 1] == "en-us"
    assert argv[argv.index("-p") + 1] == "62"
    unknown = synth.command("hi", emotion="bewildered")
    assert unknown[unknown.index("-p") + 1] == "50"


async def test_too_long_line_is_refused_before_running_anything() -> None:
    synth = EspeakSynthesizer(max_chars=5, executable="/nonexistent/espeak")
    with pytest.raises(SynthesisError) as info:
        await synth.synthesize("far too long")
    assert info.value.reason == "too_long"


async def test_missing_binary_is_unavailable() -> None:
    synth = EspeakSynthesizer(executable="/nonexistent/espeak-ng")
    with pytest.raises(SynthesisError) as info:
        await synth.synthesize("hello")
    assert info.value.reason == "unavailable"


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-espeak"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_failing_binary_reports_its_stderr(tmp_path: Path) -> None:
    synth = EspeakSynthesizer(executable=_script(tmp_path, "echo 'no voice xx' >&2; exit 3"))
    with pytest.raises(SynthesisError, match="no voice xx") as info:
        await synth.synthesize("hello")
    assert info.value.reason == "failed"


async def test_garbage_output_is_a_failure(tmp_path: Path) -> None:
    synth = EspeakSynthesizer(executable=_script(tmp_path, "cat >/dev/null; echo garbage"))
    with pytest.raises(SynthesisError, match="WAV") as info:
        await synth.synthesize("hello")
    assert info.value.reason == "failed"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purposes
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


async def _wait_for_pid(pidfile: Path) -> int:
    with trio.fail_after(5):
        while not pidfile.exists() or not pidfile.read_text().strip():
            await trio.sleep(0.01)
    return int(pidfile.read_text())


async def test_deadline_kills_a_hung_synthesizer(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hung = _script(tmp_path, f"echo $$ > {pidfile}; exec sleep 30")
    synth = EspeakSynthesizer(timeout=0.3, executable=hung)
    with pytest.raises(SynthesisError) as info:
        await synth.synthesize("hello")
    assert info.value.reason == "timeout"
    assert not _alive(await _wait_for_pid(pidfile))


async def test_cancellation_kills_the_process(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    synth = EspeakSynthesizer(timeout=30, executable=_script(tmp_path, f"echo $$ > {pidfile}; exec sleep 30"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(synth.synthesize, "hello")
        pid = await _wait_for_pid(pidfile)
        assert _alive(pid)
        nursery.cancel_scope.cancel()
    assert not _alive(pid)


async def test_blank_line_is_silence_without_a_process() -> None:
    speech = await EspeakSynthesizer(executable="/nonexistent").synthesize("   ")
    assert speech.samples == 0


@needs_espeak
@pytest.mark.parametrize("text", ["Hello, I am a companion.", "こんにちは、元気ですか？"])
async def test_espeak_produces_audible_speech(text: str) -> None:
    speech = await EspeakSynthesizer().synthesize(text, emotion="happy")
    assert speech.sample_rate == 22050
    assert 0.5 < speech.duration < 10
    samples = struct.unpack(f"<{speech.samples}h", speech.pcm)
    assert max(abs(s) for s in samples) > 1000  # not silence


@needs_espeak
async def test_espeak_text_starting_with_a_dash_is_spoken_not_parsed() -> None:
    speech = await EspeakSynthesizer(voice="en").synthesize("-w nothing")
    assert speech.duration > 0.3
