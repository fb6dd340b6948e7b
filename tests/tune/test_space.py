"""The tuner's search space: candidate values seeded from the SLO, the cores and the engine's launch times."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.conftest import ARTIFACTS, MANIFEST
from tritonbundle.build.stage import BuildOptions, load_manifest
from tritonbundle.manifest import Tunables
from tritonbundle.tune.run import can_fold
from tritonbundle.tune.space import GRAPH_BUCKET_SETS, ORDER, Knob, describe, key, space


def test_every_knob_is_a_manifest_tunable() -> None:
    assert set(ORDER) <= set(Tunables.__dataclass_fields__)


def test_queue_delays_stay_within_a_tenth_of_the_slo() -> None:
    delays = space(slo_ms=50, cores=2, text=True, gpu=False).knob("max_queue_delay_us").values
    assert delays[0] == 0 and max(delays) == 5000
    assert space(slo_ms=10, cores=2, text=True, gpu=False).knob("max_queue_delay_us").values[-1] == 1000


def test_instances_bounded_by_the_cores() -> None:
    assert space(slo_ms=50, cores=2, text=True, gpu=False).knob("instances").values == (1, 2)
    assert space(slo_ms=50, cores=16, text=True, gpu=True).knob("instances").values[-1] == 8


def test_launch_times_cut_the_batch_buckets_where_a_launch_outgrows_half_the_slo() -> None:
    launch = {(1, 64): 1.0, (32, 512): 12.0, (64, 512): 24.0, (128, 512): 51.0}
    s = space(slo_ms=50, cores=16, text=True, gpu=True, launch_ms=launch)
    assert max(max(b) for b in s.knob("batch_buckets").values) == 64
    assert any("at 128" in n for n in s.notes)
    everything_fits = space(slo_ms=500, cores=16, text=True, gpu=True, launch_ms=launch)
    assert max(max(b) for b in everything_fits.knob("batch_buckets").values) == 256


def test_a_model_without_a_tokenizer_has_no_tokenizer_knobs() -> None:
    names = [k.name for k in space(slo_ms=50, cores=4, text=False, gpu=False).knobs]
    assert "tokenizer_instances" not in names and "instances" in names


def test_neighbours_and_the_nearest_value_for_an_off_grid_start() -> None:
    knob = Knob("max_queue_delay_us", (0, 500, 1000, 2500, 5000))
    assert knob.neighbours(1000) == [500, 2500]
    assert knob.neighbours(0) == [500]
    assert knob.neighbours(40000) == [5000]
    buckets = Knob("batch_buckets", ((1,), (1, 8), (1, 8, 32)))
    assert buckets.neighbours((1, 8)) == [(1,), (1, 8, 32)]


def test_key_and_describe_treat_lists_and_tuples_alike() -> None:
    assert key({"batch_buckets": [1, 8], "instances": 2}) == key({"instances": 2, "batch_buckets": (1, 8)})
    assert describe({"instances": 2, "batch_buckets": (1, 8)}) == "batch_buckets=[1, 8], instances=2"


def test_the_start_and_the_defaults_join_the_candidates() -> None:
    s = space(slo_ms=50, cores=2, text=True, gpu=False,
              include=({"max_queue_delay_us": 2000, "batch_buckets": [1, 16]}, {"max_queue_delay_us": 20000}))
    assert s.knob("max_queue_delay_us").values == (0, 500, 1000, 2000, 2500, 5000, 20000)
    assert s.knob("max_queue_delay_us").neighbours(2000) == [1000, 2500]
    assert (1, 16) in s.knob("batch_buckets").values


def test_tokenizer_threads_leave_half_the_cores_to_the_rest() -> None:
    assert space(slo_ms=50, cores=16, text=True, gpu=True).knob("tokenizer_threads").values == (1, 2, 4, 8)
    assert space(slo_ms=50, cores=2, text=True, gpu=False).knob("tokenizer_threads").values == (1,)


def test_folding_the_tokenizer_is_a_knob_only_where_the_model_can() -> None:
    def names(**kw: bool) -> list[str]:
        return [k.name for k in space(slo_ms=50, cores=16, gpu=True, **kw).knobs]

    assert "tokenize_in_encoder" in names(text=True, fold=True)
    assert "tokenize_in_encoder" not in names(text=True, fold=False)
    folds = space(slo_ms=50, cores=16, text=True, gpu=True, fold=True).knob("tokenize_in_encoder")
    assert folds.values == (False, True) and folds.neighbours(False) == [True] and folds.neighbours(True) == [False]


def test_the_tuner_offers_folding_where_the_runtime_and_the_task_accept_it() -> None:
    def spec(**overrides: str) -> Any:
        return load_manifest(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, overrides=overrides)).models[0]

    pytorch = spec(runtime="pytorch", target="gpu", precision="fp16")
    assert can_fold(pytorch)
    assert not can_fold(spec(runtime="onnxruntime"))
    assert not can_fold(dataclasses.replace(pytorch, task="text-classification"))


def test_folding_keeps_the_number_of_processes() -> None:
    """E encoders beside T tokenizers fold into E + T instances (the largest candidate up to it) and
    unfold into E - T encoders (at least one); no other knob moves, and other knobs move alone."""
    searched = space(slo_ms=50, cores=16, text=True, gpu=True, fold=True)
    unfolded = {"instances": 2, "tokenizer_instances": 4, "tokenize_in_encoder": False, "tokenizer_threads": 1}
    assert searched.moved(unfolded, "tokenize_in_encoder", True) == {**unfolded, "instances": 6,
                                                                     "tokenize_in_encoder": True}
    assert searched.moved({**unfolded, "instances": 3}, "tokenize_in_encoder", True)["instances"] == 6
    assert searched.moved({**unfolded, "instances": 6}, "tokenize_in_encoder", True)["instances"] == 8
    folded = {**unfolded, "instances": 8, "tokenize_in_encoder": True}
    assert searched.moved(folded, "tokenize_in_encoder", False)["instances"] == 4
    assert searched.moved({**folded, "instances": 2}, "tokenize_in_encoder", False)["instances"] == 1
    assert searched.moved(unfolded, "instances", 3) == {**unfolded, "instances": 3}
    assert searched.moved(folded, "tokenize_in_encoder", True) == folded
    without = dataclasses.replace(searched, knobs=tuple(k for k in searched.knobs if k.name != "instances"))
    assert without.moved(unfolded, "tokenize_in_encoder", True)["instances"] == 6


def test_the_threads_come_after_the_fold_in_a_round() -> None:
    """Folded, four tokenizer threads passed +40 % on the H200; unfolded (the tokenizer model's threads)
    nothing: a round that folds tries the threads on the folded processes (docs/tuning.md)."""
    names = [k.name for k in space(slo_ms=50, cores=16, text=True, gpu=True, fold=True).knobs]
    assert names.index("instances") < names.index("tokenize_in_encoder") < names.index("tokenizer_threads")
    assert names.index("tokenizer_threads") < names.index("max_queue_delay_us")


def test_buckets_between_the_powers_of_two_are_offered_only_to_an_engine_of_cuda_graphs() -> None:
    fine = GRAPH_BUCKET_SETS[0]
    graphs = space(slo_ms=50, cores=16, text=True, gpu=True,
                   launch_ms={(1, 64): 1.0, (64, 512): 20.0, (128, 512): 51.0}).knob("batch_buckets").values
    assert fine in graphs
    # ordered by the largest bucket, then by how many: after the powers of two to 64, before those to 128
    assert graphs.index(fine) == graphs.index((1, 2, 4, 8, 16, 32, 64)) + 1
    assert fine not in space(slo_ms=50, cores=16, text=True, gpu=True).knob("batch_buckets").values
    assert fine not in space(slo_ms=50, cores=2, text=True, gpu=False).knob("batch_buckets").values
    # the launch times' cap applies to them too
    capped = space(slo_ms=50, cores=16, text=True, gpu=True, launch_ms={(32, 512): 20.0, (64, 512): 30.0})
    assert fine not in capped.knob("batch_buckets").values
