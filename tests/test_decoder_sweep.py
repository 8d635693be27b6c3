"""Decoder sweeps without a GPU: each point a decoder.py run through the launcher, replayed from
synthesised measurements (runfixtures.decoder_measurement: each row as predicted, out of memory
past a limit); fit.py and report.py on such sweeps; the allocator settings a decoder file
carries. The GPU tests at the end run a real decoder sweep to out of memory."""

from __future__ import annotations

import validate

import runfixtures

REGISTRY = validate.load_registry()


# ---------------------------------------------------------------- allocator settings


def test_a_decoder_file_at_the_default_allocator_settings_says_its_prediction_applies():
    document = runfixtures.decoder_measurement(runfixtures.TINY_DECODER)
    assert document["summary"]["prediction"]["applicable"] is True
    assert "not_applicable_because" not in document["summary"]["prediction"]
    assert validate.validate_document(document, REGISTRY) == []


def test_expandable_segments_void_a_decoder_prediction_and_the_file_says_why():
    allocator = dict(runfixtures.DEFAULT_ALLOCATOR, expandable_segments=True)
    document = runfixtures.decoder_measurement(runfixtures.TINY_DECODER, allocator=allocator)
    prediction = document["summary"]["prediction"]
    assert prediction["applicable"] is False
    assert prediction["not_applicable_because"] == (
        "allocator settings differ from the modelled defaults: expandable_segments=True"
    )
    assert validate.validate_document(document, REGISTRY) == []
    del prediction["not_applicable_because"]  # a void prediction must say why
    assert validate.validate_document(document, REGISTRY) != []
