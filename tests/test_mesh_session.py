"""The mesh session (tests/mesh_session.py): the tests of sharding see eight devices, every other test one,
and a stand-in reports its test's outcome there, never a pass for a test that did not pass."""

import json
import types

import jax
import pytest

import mesh_session


@pytest.mark.mesh
def test_the_mesh_session_has_eight_devices():
    assert jax.device_count() == mesh_session.NUM_DEVICES == 8


def test_every_other_test_has_one_device():
    assert jax.device_count() == 1


def report(when, outcome, text="", nodeid="probe.py::t"):
    longrepr = ("probe.py", 3, f"Skipped: {text}") if outcome == "skipped" else text
    return types.SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, skipped=outcome == "skipped",
                                 longrepr=longrepr, longreprtext=text)


def test_the_session_records_each_outcome_and_not_the_passed_set_ups(tmp_path):
    path = str(tmp_path / "results.jsonl")
    for r in (report("setup", "passed"), report("call", "passed"), report("teardown", "failed", "E boom"),
              report("setup", "skipped", "no GPU", nodeid="probe.py::u")):
        mesh_session.record(r, path)
    lines = [json.loads(line) for line in open(path)]
    assert [(r["nodeid"][-1], r["when"], r["outcome"]) for r in lines] == [
        ("t", "call", "passed"), ("t", "teardown", "failed"), ("u", "setup", "skipped")]
    assert lines[1]["text"] == "E boom" and lines[2]["text"] == "Skipped: no GPU"


def test_a_stand_in_passes_only_when_its_call_passed_and_nothing_failed():
    def outcome(*records):
        return mesh_session.outcome_of("a",
                                       records=[dict(nodeid="a", when=w, outcome=o, text=t) for w, o, t in records],
                                       exit_code=1, output="the session's last words")

    assert outcome(("call", "passed", "")) == ("passed", "")
    assert outcome(("call", "passed", ""), ("teardown", "failed", "E leak")) == ("failed", "[teardown] E leak")
    assert outcome(("setup", "failed", "E fixture")) == ("failed", "[setup] E fixture")
    assert outcome(("setup", "skipped", "why")) == ("skipped", "why")
    never, text = outcome()  # the session ended (or crashed) without running it
    assert never == "failed" and "exit 1" in text and "the session's last words" in text
