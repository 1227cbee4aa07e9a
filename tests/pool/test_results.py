"""The JSON form of the pool's results: what `--json` prints and the daemon sends, field for field."""

import json

from zenedge.pool.results import Admitted, AttemptSummary, Pulled, ShrinkStep

ATTEMPT = AttemptSummary("3d3be9d2dee2", ["alpha", "beta"], 0.26, {"alpha": 0.98, "beta": 0.92},
                         {"alpha": 16, "beta": 16}, accepted=True)
STEP = ShrinkStep(["gamma"], "bf16", "int8", {"gamma": 0.99}, freed_bytes=1000, kept=True)


def test_a_stored_profile_says_nothing_of_merges_or_evictions():
    shown = Admitted("alpha", "a" * 64, "lora", 123, "stored", compressed=[STEP]).as_dict()
    assert set(shown) == {"name", "adapter_id", "kind", "bytes", "action", "compressed", "profile"}
    assert shown["compressed"] == [{"names": ["gamma"], "stored_as": "bf16", "compressed_to": "int8",
                                    "retention": {"gamma": 0.99}, "freed_bytes": 1000, "kept": True}]


def test_a_merge_names_its_partners_and_the_attempts_and_a_least_loss_one_what_it_lost():
    merged = Admitted("beta", "b" * 64, "merged", 456, "merged", merged_with=["alpha"], attempts=[ATTEMPT])
    shown = json.loads(json.dumps(merged.as_dict()))
    assert shown["merged_with"] == ["alpha"] and "evicted" not in shown and "below_threshold" not in shown
    assert shown["attempts"] == [{"candidate": "3d3be9d2dee2", "members": ["alpha", "beta"], "similarity": 0.26,
                                  "retention": {"alpha": 0.98, "beta": 0.92}, "examples": {"alpha": 16, "beta": 16},
                                  "accepted": True}]
    refused = AttemptSummary("3d3be9d2dee2", ["alpha", "beta"], 0.26, {"alpha": 0.4, "beta": 0.9}, {},
                             accepted=False, lost_gain=0.7, eviction_loses=1)
    least = Admitted("beta", "b" * 64, "merged", 456, "merged", merged_with=["alpha"], attempts=[refused],
                     below_threshold=True, lost_gain=0.7, eviction_would_lose=1).as_dict()
    assert least["below_threshold"] and least["lost_gain"] == 0.7 and least["eviction_would_lose"] == 1
    assert least["attempts"][0]["lost_gain"] == 0.7 and least["attempts"][0]["eviction_loses"] == 1


def test_an_eviction_lists_what_went_even_with_no_merge_tried():
    shown = Admitted("beta", "b" * 64, "lora", 456, "evicted", evicted=["alpha"]).as_dict()
    assert shown["evicted"] == ["alpha"] and shown["attempts"] == [] and "merged_with" not in shown


def test_a_pull_repeats_only_the_admission_details_that_say_something():
    up_to_date = Pulled("writer", "1.0.0", "lora", 123, "a" * 64)
    assert up_to_date.up_to_date and up_to_date.as_dict() == {
        "name": "writer", "version": "1.0.0", "kind": "lora", "bytes": 123, "adapter_id": "a" * 64, "up_to_date": True}
    admitted = Admitted("writer", "b" * 64, "merged", 456, "merged", merged_with=["coder"], attempts=[ATTEMPT],
                        profile={"total_seconds": 1.5})
    shown = Pulled("writer", "1.0.0", "merged", 456, "b" * 64, admitted).as_dict()
    assert shown["policy"] == "merged" and shown["up_to_date"] is False
    assert shown["merged_with"] == ["coder"] and shown["profile"] == {"total_seconds": 1.5}
    assert "compressed" not in shown and "evicted" not in shown   # empty: left out
