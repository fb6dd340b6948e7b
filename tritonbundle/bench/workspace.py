"""What every phase of the benchmark stands on: the tokenizer, the repository the build stage writes
for each model, and the environment the servers and Python-backend stubs inherit."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tritonbundle import proc, recipes
from tritonbundle.bench.options import BenchOptions
from tritonbundle.manifest import ModelSpec
from tritonbundle.plan import ModelPlan
from tritonbundle.recipes import Recipe

TOKENIZER_ENV = "TRITONBUNDLE_TOKENIZER"
STUB_BIN_ENV = "TRITONBUNDLE_STUB_BIN"
#: tritonserver's arguments on the GPU machine: no DCGM there, and the Python backend's shared
#: memory sized for batches of 512-token requests.
SERVER_ARGS = ("--allow-gpu-metrics=false", "--backend-config=python,shm-default-byte-size=16777216")


def load_procs(requested: int) -> int:
    """Load generator processes: as requested, else half the usable CPUs less one for the server (at most 8)."""
    return requested or max(1, min(8, len(proc.usable_cpus()) // 2 - 1))


def tokenizer_file() -> Path:
    """BERT uncased tokenizer.json: ``$TRITONBUNDLE_TOKENIZER``, else the recipes' (MiniLM's)."""
    explicit = os.environ.get(TOKENIZER_ENV)
    return Path(explicit) if explicit else recipes.tokenizer_file("minilm")


def manifest_for(recipe: Recipe, options: BenchOptions, traffic_path: Path, tokenizer: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "traffic": str(traffic_path.resolve()),
        "defaults": {
            "target": options.target, "runtime": "pytorch", "precision": options.precision,
            "batch_buckets": list(options.batch_buckets), "sequence_buckets": options.sequence_buckets,
            "max_queue_delay_us": options.encoder_queue_delay_us, "instances": options.instances,
            # The engine splits every batch into its own launches; a preferred size would make Triton
            # send batches of 2 the moment two requests wait, instead of gathering more.
            "preferred_batch_sizes": "none",
            "tokenizer_instances": options.tokenizer_instances,
            "tokenizer_queue_delay_us": options.tokenizer_queue_delay_us,
            "cuda_graphs": options.device == "cuda",
            # A tune run's winner (``--tuned``) replaces the hand-set values above.
            **{k: list(v) if isinstance(v, tuple) else v for k, v in options.tuned.items()},
        },
        "models": [{
            "name": recipe.model_name, "task": "text-embedding", "source": {"recipe": recipe.name},
            "tokenizer": {"file": str(tokenizer.resolve()), "max_length": 512}, "max_sequence_length": 512,
            "inputs": [
                {"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]},
                {"name": "attention_mask", "dtype": "INT64", "shape": ["batch", "sequence"]},
            ],
            "outputs": [{"name": "embedding", "dtype": "FP32", "shape": ["batch", recipe.hidden]}],
        }],
    }


def write_manifest(recipe: Recipe, options: BenchOptions, folder: Path, traffic_path: Path, tokenizer: Path) -> Path:
    """``folder/models.yaml``: the manifest the bench builds (and ``tritonbundle tune --bench-model`` tunes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump(manifest_for(recipe, options, traffic_path, tokenizer), sort_keys=False))
    return path


@dataclass
class Built:
    spec: ModelSpec
    plan: ModelPlan
    repository: Path
    version_dir: Path
    manifest: Path


def build_repository(recipe: Recipe, options: BenchOptions, work: Path, traffic_path: Path, tokenizer: Path) -> Built:
    """``tritonbundle build`` for ``--target gpu --runtime pytorch``, through the build stage itself
    (the pytorch runtime needs no ONNX export, and the example-model package is absent on the GPU machine)."""
    from tritonbundle.build.stage import BuildOptions, build, load_manifest, plan_model

    folder = work / recipe.model_name
    manifest_path = write_manifest(recipe, options, folder, traffic_path, tokenizer)
    build_options = BuildOptions(manifest=manifest_path, repository=folder / "model_repository", artifacts=folder / "artifacts")
    build(build_options)
    spec = load_manifest(build_options).models[0]
    repo = build_options.repository
    return Built(spec, plan_model(spec, build_options), repo, repo / spec.encoder_name / "1", manifest_path)


def prepare_process_env() -> None:
    """Environment the servers and Python stubs inherit: this interpreter first on PATH (the stubs run
    isolated and find their packages through the ``python3`` on PATH), or ``$TRITONBUNDLE_STUB_BIN``
    before it when set (a bin/ whose environment has numpy 1.x: the wheel's stubs need it), and this
    interpreter's libpython first on LD_LIBRARY_PATH (a stub must embed the libpython that matches
    the standard library it finds)."""
    import sysconfig

    first = [p for p in (os.environ.get(STUB_BIN_ENV, ""), str(Path(sys.executable).parent)) if p]
    os.environ["PATH"] = os.pathsep.join((*first, os.environ.get("PATH", "")))
    libdir = sysconfig.get_config_var("LIBDIR")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if libdir and Path(libdir, f"libpython{version}.so.1.0").exists():
        current = os.environ.get("LD_LIBRARY_PATH", "")
        if libdir not in current.split(os.pathsep):
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, current) if p)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
