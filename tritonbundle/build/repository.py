"""Write the model repository: per model its ``config.pbtxt`` and version files.

Each manifest model becomes its encoder (the network, in the runtime the manifest names: ``<name>``
for a tensor model, ``<name>_encoder`` behind a text ensemble) plus the Triton models its task writes
around it (:mod:`tritonbundle.tasks`: tokenizer, post-processing, ensemble).

Everything is written to a staging folder next to the repository first; only when every model has
been written and every config reads back as a valid ``ModelConfig`` are the model folders swapped
in (one ``rename`` each). A failed build therefore leaves the previous repository as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonbundle import runtimes, tasks
from tritonbundle.contract import ContractError, Parameters
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.log import LOG
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import read_config, restamp, write_config
from tritonbundle.plan import ModelPlan
from tritonbundle.runtimes.base import BuildContext


@dataclass(frozen=True)
class ModelArtifacts:
    #: The ONNX the runtime serves (at the manifest's precision), None for runtimes that serve none.
    onnx_path: Path | None
    tokenizer_path: Path | None
    #: The FP32 ONNX that engines are checked against (the same file at fp32).
    reference_onnx: Path | None = None


def _stage_model(
    spec: ModelSpec, plan: ModelPlan, artifacts: ModelArtifacts, staging: Path, work_dir: Path, *,
    version: int, force: bool, previous: Path | None, check_only: bool = False,
) -> dict[str, type[Parameters] | None]:
    """Write every Triton model that ``spec`` becomes into ``staging``; return their names and the
    parameter record each one's config must carry."""
    runtime = runtimes.get(spec.runtime)
    ctx = BuildContext(
        spec=spec, plan=plan, onnx_path=artifacts.onnx_path, work_dir=work_dir, version=version, force=force,
        previous_dir=previous, reference_onnx=artifacts.reference_onnx or artifacts.onnx_path,
        tokenizer_json=artifacts.tokenizer_path, check_only=check_only,
    )
    encoder_dir = staging / spec.encoder_name
    written = runtime.write_files(ctx, encoder_dir / str(version))
    write_config(runtime.config(ctx, written), encoder_dir)
    names: dict[str, type[Parameters] | None] = {spec.encoder_name: runtime.parameters(spec)}
    names |= tasks.get(spec.task).write(ctx, runtime, staging, artifacts.tokenizer_path)
    return names


def _check_staged(staging: Path, names: dict[str, type[Parameters] | None], source: str) -> None:
    """Every config parses as Triton's ModelConfig, names its folder, and carries exactly the
    parameter record its served model (or the clients) will read: a renamed or missing parameter
    fails here, at build time, not at the first request."""
    for name, record in names.items():
        restamp(staging / name / "config.pbtxt", source)
        config = read_config(staging / name / "config.pbtxt")  # raises ConfigError naming the file
        if config.name != name:
            raise ConfigError(f"{staging / name}: config names the model {config.name!r}")
        if record is not None:
            params = {k: v.string_value for k, v in config.parameters.items()}
            try:
                record.from_parameters(params, strict=True, model=name)
            except ContractError as e:
                raise BuildError(f"{staging / name / 'config.pbtxt'}: {e}") from e


@contextlib.contextmanager
def _staged(
    models: Sequence[tuple[ModelSpec, ModelPlan, ModelArtifacts]], repository: Path, *, work_root: Path, version: int,
    force: bool, check_only: bool, source: str,
) -> Iterator[tuple[Path, dict[str, type[Parameters] | None]]]:
    """Every model written and checked in a staging folder next to ``repository`` (removed after)."""
    staging = repository.parent / f".{repository.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names: dict[str, type[Parameters] | None] = {}
    try:
        for spec, plan, artifacts in models:
            previous = repository / spec.encoder_name / str(version)
            names |= _stage_model(
                spec, plan, artifacts, staging, work_root / spec.name, version=version, force=force,
                previous=previous if previous.is_dir() else None, check_only=check_only,
            )
        _check_staged(staging, names, source)
        yield staging, names
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_repository(
    models: Sequence[tuple[ModelSpec, ModelPlan, ModelArtifacts]],
    repository: Path,
    *,
    work_root: Path,
    version: int = 1,
    force: bool = False,
    source: str = "the models manifest",
) -> list[str]:
    """Stage every model, check it, then swap the model folders into ``repository``; each config names
    ``source``, the manifest it came from."""
    repository = Path(repository).resolve()  # a symlink's target: staged beside it, on its file system
    repository.mkdir(parents=True, exist_ok=True)
    if os.stat(repository).st_dev != os.stat(repository.parent).st_dev:  # the swap renames: one file system
        raise BuildError(f"{repository} is a mount point: the build stages next to it and renames into it, "
                         "which cannot cross file systems; mount its parent folder instead and build into a "
                         "folder of it")
    with _staged(models, repository, work_root=work_root, version=version, force=force, check_only=False,
                 source=source) as (staging, names):
        trash = repository.parent / f".{repository.name}.old-{os.getpid()}"
        trash.mkdir(exist_ok=True)
        for name in names:
            target = repository / name
            if target.exists():
                target.rename(trash / name)
            (staging / name).rename(target)
        shutil.rmtree(trash, ignore_errors=True)
        LOG.info("    wrote %s: %s", repository, ", ".join(sorted(names)))
        return list(names)


def _files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def differences(
    models: Sequence[tuple[ModelSpec, ModelPlan, ModelArtifacts]], repository: Path, *, work_root: Path, version: int = 1,
    source: str = "the models manifest",
) -> list[str]:
    """What ``write_repository`` would change in ``repository`` (empty: nothing): the whole repository is
    written to a staging folder the way a build writes it, engines reused from ``repository`` or
    reported as needing a rebuild (never built here), and every file compared, byte for byte."""
    repository = Path(repository)
    if not repository.is_dir():
        return [f"{repository} does not exist"]
    with _staged(models, repository, work_root=work_root, version=version, force=False, check_only=True,
                 source=source) as (staging, names):
        problems = []
        for name in sorted(names):
            want, have = _files(staging / name), _files(repository / name) if (repository / name).is_dir() else {}
            problems += [f"{name}/{rel} is missing" for rel in sorted(set(want) - set(have))]
            problems += [f"{name}/{rel} is not written by this build" for rel in sorted(set(have) - set(want))]
            problems += [f"{name}/{rel} differs from what this build writes" for rel in sorted(set(want) & set(have))
                         if want[rel].read_bytes() != have[rel].read_bytes()]
        return problems
