"""server/surfaces/transcriptions.py's pure parts: the multipart form with
upstream's duplicate rules and our part bounds, and the string-typed
fields read as std::stoul / std::stof read them."""

from __future__ import annotations

import pytest

from mlxcel_trio.server.http.errors import ApiError
from mlxcel_trio.server.surfaces import transcriptions as T

BOUNDARY = "XyZ"
CTYPE = f"multipart/form-data; boundary={BOUNDARY}"


def _form(*parts: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def test_files_are_parts_with_a_filename_and_a_repeated_file_keeps_the_last():
    fields, files = T.parse_form(_form(("file", b"one", "a.wav"), ("model", b"whisper-1", None),
                                       ("file", b"two", "b.wav")), CTYPE)
    assert files == {"file": b"two"} and fields == {"model": "whisper-1"}
    fields, files = T.parse_form(_form(("file", b"not a file part", None)), CTYPE)
    assert files == {} and fields == {"file": "not a file part"}


def test_a_repeated_text_field_falls_back_to_its_default():
    fields, _ = T.parse_form(_form(("response_format", b"text", None),
                                   ("response_format", b"verbose_json", None)), CTYPE)
    assert T.form_text(fields, "response_format", "json") == "json"
    assert T.form_temperature(fields | {"temperature": fields["response_format"]}) == 0.0


def test_a_body_that_is_not_a_form_has_no_file():
    assert T.parse_form(b'{"file": "x"}', "application/json") == ({}, {})
    assert T.parse_form(b"", "multipart/form-data") == ({}, {})   # no boundary


def test_part_count_and_part_size_are_bounded():
    many = _form(*((f"f{i}", b"x", None) for i in range(T.MAX_PARTS + 1)))
    with pytest.raises(ApiError, match="more than 32 parts") as err:
        T.parse_form(many, CTYPE)
    assert err.value.status == 400
    T.parse_form(_form(*((f"f{i}", b"x", None) for i in range(T.MAX_PARTS))), CTYPE)
    big = _form(("file", bytes(T.MAX_PART_BYTES + 1), "a.wav"))
    with pytest.raises(ApiError, match="larger than 26214400 bytes") as err:
        T.parse_form(big, CTYPE)
    assert err.value.status == 413


def test_a_truncated_form_is_a_400():
    with pytest.raises(ApiError, match="malformed multipart body") as err:
        T.parse_form(_form(("file", b"abc", "a.wav"))[:-20], CTYPE)
    assert err.value.status == 400


@pytest.mark.parametrize("raw, want", [("12", 12), (" 7tokens", 7), ("+3", 3), ("-1", None),
                                       ("0", 0)])
def test_max_tokens_reads_as_stoul(raw, want):
    assert T.form_max_tokens({"max_tokens": raw}) == want


@pytest.mark.parametrize("raw, want", [("0.5", 0.5), (" 1e-1x", 0.1), ("-2", 0.0), (".5", 0.5)])
def test_temperature_reads_as_stof(raw, want):
    assert T.form_temperature({"temperature": raw}) == pytest.approx(want)


@pytest.mark.parametrize("name, raw, message", [
    ("max_tokens", "many", "Invalid 'max_tokens': expected an unsigned integer, got 'many'"),
    ("temperature", "hot", "Invalid 'temperature': expected a number, got 'hot'"),
    ("temperature", "nan", "Invalid 'temperature': expected a finite number, got 'nan'"),
])
def test_a_field_with_no_number_in_front_is_a_400(name, raw, message):
    read = T.form_max_tokens if name == "max_tokens" else T.form_temperature
    with pytest.raises(ApiError) as err:
        read({name: raw})
    assert err.value.status == 400 and err.value.message == message
