"""The pure parts of the WebRTC layer: the voice playlist, the offer exchange, control frames,
ICE address rules, and the PCM conversion."""

from __future__ import annotations

import itertools
import json
import math
import struct

import pytest

from companion.rtc.audio import to_track_rate
from companion.rtc.control import ControlError, StopSpeech, VoiceSwitch, interpret_control, is_new_message
from companion.rtc.http import offer_url
from companion.rtc.ice import LOOPBACK, candidate_addresses_for
from companion.rtc.island import single_exceptions
from companion.rtc.opus import OpusLineEncoder, encode_opus, opus_silence
from companion.rtc.signaling import (
    OfferError,
    OfferRequest,
    answer_body,
    audio_codec,
    error_body,
    parse_offer,
)
from companion.rtc.voicequeue import FRAME_BYTES, PCM_SILENCE, SAMPLE_RATE, VoiceQueue, pcm_frames
from companion.voice import Speech

# --- the voice playlist ----------------------------------------------------------------------


def _pcm(frames: float, value: int = 1000) -> bytes:
    return struct.pack("<h", value) * int(frames * FRAME_BYTES // 2)


def _line(frames: float, value: int = 1000) -> list[bytes]:
    return pcm_frames(_pcm(frames, value))


def test_pcm_frames_cuts_20ms_and_pads_the_last() -> None:
    frames = pcm_frames(_pcm(1.5, 1))
    assert [len(f) for f in frames] == [FRAME_BYTES, FRAME_BYTES]
    assert frames[1][: FRAME_BYTES // 2] == _pcm(0.5, 1) and frames[1][FRAME_BYTES // 2 :] == bytes(
        FRAME_BYTES // 2
    )
    assert pcm_frames(b"") == []
    with pytest.raises(ValueError, match="whole"):
        pcm_frames(b"\x00")


def test_a_line_is_finished_only_when_the_sender_comes_back_after_its_last_frame() -> None:
    q = VoiceQueue()
    assert q.add("a", _line(2)) is None
    first = q.next_frame()
    assert (first.playing, first.finished) == ("a", ())
    last = q.next_frame()
    assert (last.playing, last.finished) == ("a", ())
    assert "a" in q and not q.idle
    after = q.next_frame()  # the last frame has been sent now
    assert after.finished == ("a",)
    assert after.playing is None
    assert after.frame == PCM_SILENCE
    assert q.idle


def test_lines_play_in_order_then_the_queue_sends_its_silence() -> None:
    q = VoiceQueue(silence=b"quiet")
    q.add("a", [b"a1", b"a2"])
    q.add("b", [b"b1"])
    steps = [q.next_frame() for _ in range(5)]
    assert [s.frame for s in steps] == [b"a1", b"a2", b"b1", b"quiet", b"quiet"]
    assert [s.playing for s in steps] == ["a", "a", "b", None, None]
    assert [s.finished for s in steps] == [(), (), ("a",), ("b",), ()]


def test_an_incomplete_line_plays_what_it_has_and_waits_for_the_rest() -> None:
    q = VoiceQueue(silence=b"quiet")
    q.add("a", [b"a1"], complete=False)
    steps = [q.next_frame() for _ in range(3)]
    assert [(s.frame, s.playing, s.finished) for s in steps] == [
        (b"a1", "a", ()),
        (b"quiet", "a", ()),  # caught up with the encoder: silence, still playing "a"
        (b"quiet", "a", ()),
    ]
    assert q.extend("a", [b"a2"], complete=True)
    assert q.next_frame().frame == b"a2"
    assert q.next_frame().finished == ("a",)
    assert not q.extend("a", [b"late"])  # gone (finished or flushed)


def test_an_empty_line_finishes_when_reached() -> None:
    q = VoiceQueue()
    q.add("empty", [])
    q.add("b", _line(1))
    step = q.next_frame()
    assert step.finished == ("empty",) and step.playing == "b"


def test_flush_drops_playing_and_queued_lines_but_not_a_completely_sent_one() -> None:
    q = VoiceQueue()
    q.add("a", _line(1))
    q.add("b", _line(3))
    q.add("c", _line(3))
    q.next_frame()  # a's only frame handed over
    q.next_frame()  # a finished; b playing
    q.add("d", _line(1))
    assert q.flush() == ["b", "c", "d"]
    assert q.next_frame().playing is None
    q2 = VoiceQueue()
    q2.add("x", _line(1))
    q2.next_frame()
    assert q2.flush() == []
    assert q2.take_finished() == ["x"]


def test_queue_limits_refuse_instead_of_growing() -> None:
    q = VoiceQueue(max_lines=2, max_seconds=1.0)
    assert q.add("a", _line(10)) is None
    full = q.add("b", _line(50))  # 0.2 s + 1.0 s > 1 s
    assert full is not None and "1 s" in full.reason
    assert q.add("b", _line(10)) is None
    full = q.add("c", _line(1))
    assert full is not None and "2 lines" in full.reason
    with pytest.raises(ValueError, match="already queued"):
        q.add("a", [])
    q.next_frame()
    q.flush()
    assert q.add("big", _line(50)) is None  # flushing gave the room back


# --- Opus ahead of time ----------------------------------------------------------------------


def test_opus_packets_decode_back_to_the_line() -> None:
    import av

    tone = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / SAMPLE_RATE)))
        for i in range(SAMPLE_RATE // 2)
    )
    packets = encode_opus(tone)
    assert len(packets) == len(pcm_frames(tone)) == 25
    decoder = av.CodecContext.create("libopus", "r")
    decoded = bytearray()
    for data in packets:
        for frame in decoder.decode(av.Packet(data)):
            decoded += bytes(frame.planes[0])[: frame.samples * 2 * len(frame.layout.channels)]
    samples = memoryview(bytes(decoded)).cast("h")
    assert max(abs(v) for v in samples) > 4000  # the tone survived
    silence = opus_silence()
    assert 0 < len(silence) < 100
    fresh = av.CodecContext.create("libopus", "r")
    for _ in range(3):
        quiet = b"".join(bytes(f.planes[0]) for f in fresh.decode(av.Packet(silence)))
    assert max(abs(v) for v in memoryview(quiet).cast("h")) < 50
    assert encode_opus(b"") == []


def test_a_line_encoded_in_pieces_has_one_packet_per_frame() -> None:
    frames = pcm_frames(_pcm(30, 3000))
    encoder = OpusLineEncoder()
    head = encoder.encode(frames[:8])
    assert 7 <= len(head) <= 8  # the encoder may hold one packet back (look-ahead)
    tail = encoder.encode_rest(frames[8:])
    assert len(head) + len(tail) == len(frames) == len(encode_opus(_pcm(30, 3000)))


def test_audio_codec_reads_the_first_audio_payload_type() -> None:
    sdp = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:111 opus/48000/2\r\n"
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
    )
    assert audio_codec(sdp) == "opus"
    pcmu = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=rtpmap:0 PCMU/8000\r\n"
    assert audio_codec(pcmu) == "pcmu"
    assert audio_codec("v=0\r\nm=application 9 x\r\na=rtpmap:0 PCMU/8000\r\n") is None
    assert audio_codec("v=0\r\nm=audio 0 UDP/TLS/RTP/SAVPF\r\n") is None


# --- PCM conversion ------------------------------------------------------------------------


def test_resampling_keeps_duration_and_pitch() -> None:
    rate = 22050
    wave = (int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(rate))
    tone = b"".join(struct.pack("<h", v) for v in wave)
    out = to_track_rate(Speech(tone, rate))
    samples = struct.unpack(f"<{len(out) // 2}h", out)
    assert abs(len(samples) - SAMPLE_RATE) <= 64
    crossings = sum(1 for x, y in itertools.pairwise(samples) if x < 0 <= y)
    assert 430 <= crossings <= 450  # still a 440 Hz tone
    assert to_track_rate(Speech(b"", rate)) == b""
    same = Speech(b"\x01\x00" * 10, SAMPLE_RATE)
    assert to_track_rate(same) == same.pcm


# --- the offer exchange ----------------------------------------------------------------------

SDP_DATA = "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
SDP_AV = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"


def test_offer_defaults_voice_to_the_audio_section() -> None:
    with_audio = parse_offer(json.dumps({"type": "offer", "sdp": SDP_AV}))
    assert with_audio == OfferRequest(sdp=SDP_AV, voice=True, topics=None)
    data_only = parse_offer(json.dumps({"type": "offer", "sdp": SDP_DATA}).encode())
    assert isinstance(data_only, OfferRequest) and data_only.voice is False
    quiet = parse_offer(json.dumps({"type": "offer", "sdp": SDP_AV, "voice": False}))
    assert isinstance(quiet, OfferRequest) and quiet.voice is False


def test_offer_topics_from_body_or_query() -> None:
    body = parse_offer(json.dumps({"type": "offer", "sdp": SDP_DATA, "topics": ["messages", "states"]}))
    assert isinstance(body, OfferRequest) and body.topics == frozenset({"messages", "states"})
    query = parse_offer(json.dumps({"type": "offer", "sdp": SDP_DATA}), "queries,actions")
    assert isinstance(query, OfferRequest) and query.topics == frozenset({"queries", "actions"})


@pytest.mark.parametrize(
    ("body", "code", "status"),
    [
        ("not json", "not_json", 400),
        ("[]", "invalid_offer", 400),
        (json.dumps({"type": "answer", "sdp": SDP_DATA}), "invalid_offer", 400),
        (json.dumps({"type": "offer", "sdp": 42}), "invalid_offer", 400),
        (json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio 9 RTP/AVP 0\r\n"}), "no_data_channel", 400),
        (json.dumps({"type": "offer", "sdp": SDP_DATA, "voice": True}), "invalid_offer", 400),
        (json.dumps({"type": "offer", "sdp": SDP_AV, "voice": "yes"}), "invalid_offer", 400),
        (json.dumps({"type": "offer", "sdp": SDP_DATA, "topics": ["gossip"]}), "unknown_topic", 400),
        (json.dumps({"type": "offer", "sdp": SDP_DATA, "topics": 3}), "invalid_offer", 400),
        (json.dumps({"type": "offer", "sdp": SDP_DATA + "a=x\r\n" * 20000}), "invalid_offer", 413),
    ],
)
def test_bad_offers_are_refused_with_a_reason(body: str, code: str, status: int) -> None:
    result = parse_offer(body)
    assert isinstance(result, OfferError)
    assert (result.code, result.status) == (code, status)
    assert json.loads(error_body(result))["error"]["code"] == code


def test_answer_body_shape() -> None:
    assert json.loads(answer_body("v=0", "s1", True)) == {
        "type": "answer",
        "sdp": "v=0",
        "session": "s1",
        "voice": True,
    }


# --- control frames ------------------------------------------------------------------------


def test_control_frames() -> None:
    assert interpret_control({"control": "stop"}) == StopSpeech()
    assert interpret_control({"control": "voice", "enabled": False}) == VoiceSwitch(False)
    assert isinstance(interpret_control({"control": "voice"}), ControlError)
    assert isinstance(interpret_control({"control": "dance"}), ControlError)
    assert interpret_control({"topic": "messages", "body": {}}) is None
    assert interpret_control(["control"]) is None


def test_new_message_detection() -> None:
    assert is_new_message({"topic": "messages", "body": {"method": "message.send"}})
    assert not is_new_message({"topic": "queries", "body": {"method": "query.send"}})
    assert not is_new_message({"topic": "messages", "body": "x"})
    assert not is_new_message(None)


# --- addresses -----------------------------------------------------------------------------


def test_ice_addresses_follow_the_bind_address() -> None:
    assert candidate_addresses_for("127.0.0.1") == LOOPBACK
    assert candidate_addresses_for("localhost") == LOOPBACK
    assert candidate_addresses_for("::1") == ("::1",)
    assert candidate_addresses_for("[::1]") == ("::1",)
    assert candidate_addresses_for("192.168.1.5") == ("192.168.1.5",)
    assert candidate_addresses_for("0.0.0.0") is None
    assert candidate_addresses_for("::") is None
    assert candidate_addresses_for("bridge.example") is None


def test_offer_url_from_bridge_urls() -> None:
    assert offer_url("ws://127.0.0.1:8080") == "http://127.0.0.1:8080/webrtc/offer"
    assert offer_url("wss://h.example/?token=t") == "https://h.example/webrtc/offer?token=t"
    assert offer_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080/webrtc/offer"
    assert offer_url("127.0.0.1:9") == "http://127.0.0.1:9/webrtc/offer"
    with pytest.raises(ValueError, match="scheme"):
        offer_url("ftp://x")


# --- exceptions out of the island ------------------------------------------------------------


def test_single_exceptions_unwraps_one_leaf_and_keeps_real_groups() -> None:
    with pytest.raises(KeyError), single_exceptions():
        raise ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("x")])])
    with pytest.raises(ExceptionGroup) as info, single_exceptions():
        raise ExceptionGroup("two", [KeyError("x"), ValueError("y")])
    assert len(info.value.exceptions) == 2
    with pytest.raises(ValueError, match="plain"), single_exceptions():
        raise ValueError("plain")
