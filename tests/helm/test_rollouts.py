"""Releases through Argo Rollouts: the rendered Rollout and AnalysisTemplate validate against the Argo
Rollouts v1.9.1 CRDs' own schemas (tests/helm/crds: manifests/crds of argoproj/argo-rollouts at v1.9.1,
gzipped), and the values switch between the Deployment's rolling update, blue-green and canary."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helm.test_chart import (
    FULLNAME,
    NAMESPACE,
    Obj,
    helm,  # noqa: F401 - the session fixture
    objects,
    render,
    template,
    workload,
)

CRDS = Path(__file__).with_name("crds")
#: Every scenario with a Rollout renders it from the same values a user would set.
SHARED = {"replicaCount": "2", "modelRepository.pvc.accessModes[0]": "ReadWriteMany"}


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    name = {"Rollout": "rollout-crd.yaml", "AnalysisTemplate": "analysis-template-crd.yaml"}[kind]
    crd = yaml.safe_load(gzip.decompress((CRDS / f"argo-rollouts-v1.9.1-{name}.gz").read_bytes()))
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    assert version["name"] == "v1alpha1"
    return dict(version["schema"]["openAPIV3Schema"])


def validate(doc: Obj) -> None:
    """The object against its CRD's schema; unknown fields are errors, as the API server prunes them."""
    def closed(schema: Any) -> Any:
        if isinstance(schema, dict):
            out = {k: closed(v) for k, v in schema.items()}
            if schema.get("type") == "object" and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.setdefault("additionalProperties", False)
            return out
        if isinstance(schema, list):
            return [closed(v) for v in schema]
        return schema

    schema = closed(crd_schema(doc["kind"]))
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)


def rendered(helm_path: Path, **sets: str) -> list[Obj]:
    return render(helm_path, sets={**SHARED, **sets})


@pytest.mark.parametrize("strategy", ["blueGreen", "canary"])
def test_the_rollout_and_its_analysis_validate_against_the_argo_rollouts_crds(helm: Path, strategy: str) -> None:  # noqa: F811
    docs = rendered(helm, **{"rollout.strategy": strategy})
    (rollout,) = objects(docs, "Rollout")
    (analysis,) = objects(docs, "AnalysisTemplate")
    validate(rollout)
    validate(analysis)
    assert rollout["apiVersion"] == analysis["apiVersion"] == "argoproj.io/v1alpha1"
    assert rollout["spec"]["workloadRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME,
                                              "scaleDown": "never"}
    assert workload(docs)["spec"]["replicas"] == 0, "the Deployment only holds the pod template"
    assert rollout["spec"]["replicas"] == 2 and rollout["spec"]["progressDeadlineAbort"] is True


def test_broken_objects_fail_the_crd_schema_so_the_check_can_fail(helm: Path) -> None:  # noqa: F811
    (rollout,) = objects(rendered(helm, **{"rollout.strategy": "canary"}), "Rollout")
    rollout["spec"]["strategy"]["canary"]["stepz"] = []
    with pytest.raises(jsonschema.ValidationError, match="stepz"):
        validate(rollout)
    (analysis,) = objects(rendered(helm, **{"rollout.strategy": "canary"}), "AnalysisTemplate")
    analysis["spec"]["metrics"][0]["provider"]["prometheus"]["adress"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="adress"):
        validate(analysis)


def test_blue_green_previews_the_new_pods_and_gates_promotion_on_the_analysis(helm: Path) -> None:  # noqa: F811
    docs = rendered(helm, **{"rollout.strategy": "blueGreen"})
    blue_green = objects(docs, "Rollout")[0]["spec"]["strategy"]["blueGreen"]
    assert blue_green["activeService"] == FULLNAME and blue_green["previewService"] == f"{FULLNAME}-preview"
    assert f"{FULLNAME}-preview" in [s["metadata"]["name"] for s in objects(docs, "Service")]
    gate = blue_green["prePromotionAnalysis"]
    assert gate["templates"] == [{"templateName": FULLNAME}]
    args = {a["name"]: a for a in gate["args"]}
    assert args["pod-template-hash"]["valueFrom"] == {"podTemplateHashValue": "Latest"}
    assert args["canary-url"]["value"] == f"{FULLNAME}-preview.{NAMESPACE}.svc:8000"


def test_canary_steps_come_from_values_and_the_analysis_runs_beside_them(helm: Path) -> None:  # noqa: F811
    docs = rendered(helm, **{"rollout.strategy": "canary", "rollout.canary.steps[0].setWeight": "10"})
    canary = objects(docs, "Rollout")[0]["spec"]["strategy"]["canary"]
    assert canary["steps"] == [{"setWeight": 10}]
    assert canary["analysis"]["templates"] == [{"templateName": FULLNAME}] and canary["analysis"]["startingStep"] == 1
    assert not [s for s in objects(docs, "Service") if s["metadata"]["name"].endswith("-preview")]


def test_the_analysis_reads_the_new_pods_error_ratio_and_p99_and_runs_the_canary(helm: Path) -> None:  # noqa: F811
    docs = rendered(helm, **{"rollout.strategy": "canary", "rollout.analysis.maxP99Ms": "250",
                             "rollout.analysis.models": "minilm|reranker", "metrics.podMonitor.enabled": "true"})
    metrics = {m["name"]: m for m in objects(docs, "AnalysisTemplate")[0]["spec"]["metrics"]}
    errors, p99, canary = metrics["error-ratio"], metrics["p99-ms"], metrics["canary"]
    selector = f'namespace="{NAMESPACE}",rollouts_pod_template_hash="{{{{args.pod-template-hash}}}}",model=~"minilm|reranker"'
    assert selector in errors["provider"]["prometheus"]["query"] and "nv_inference_request_failure" in errors["provider"]["prometheus"]["query"]
    assert errors["successCondition"] == "result[0] <= 0.01"
    assert 'quantile="0.99"' in p99["provider"]["prometheus"]["query"] and p99["successCondition"] == "len(result) == 0 || isNaN(result[0]) || result[0] <= 250"
    command = canary["provider"]["job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:5] == ["python3", "/scripts/canary.py", "--url", "http://{{args.canary-url}}", "--timeout-s"]
    assert [command[i + 1] for i, a in enumerate(command) if a == "--model"] == ["minilm", "reranker"]
    # What the queries need: Triton's summary quantiles, and the pods' hash label on the series.
    args = next(c for c in workload(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver")["args"]
    assert "--metrics-config=summary_latencies=true" in args
    (monitor,) = objects(docs, "PodMonitor")
    assert "rollouts-pod-template-hash" in monitor["spec"]["podTargetLabels"]


def test_the_analysis_canary_ships_its_script_when_the_probes_do_not_use_it(helm: Path) -> None:  # noqa: F811
    """The analysis Job mounts canary.py from the scripts ConfigMap: with httpGet probes
    (probes.canary.enabled=false) it is there all the same, and without a gate it is left out."""
    def scripts(docs: list[Obj]) -> Obj:
        return next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-scripts")

    gated = rendered(helm, **{"rollout.strategy": "canary", "probes.canary.enabled": "false"})
    job = next(m for m in objects(gated, "AnalysisTemplate")[0]["spec"]["metrics"] if m["name"] == "canary")
    assert job["provider"]["job"]["spec"]["template"]["spec"]["containers"][0]["command"][1] == "/scripts/canary.py"
    assert scripts(gated)["data"]["canary.py"] == (Path(__file__).parents[2] / "tritonbundle" / "canary.py").read_text()
    ungated = rendered(helm, **{"rollout.strategy": "canary", "probes.canary.enabled": "false",
                                "rollout.analysis.enabled": "false"})
    assert "canary.py" not in scripts(ungated)["data"]


def test_autoscaling_scales_the_rollout_and_the_default_is_a_plain_deployment(helm: Path) -> None:  # noqa: F811
    docs = rendered(helm, **{"rollout.strategy": "canary", "autoscaling.enabled": "true"})
    (hpa,) = objects(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": FULLNAME}
    plain = render(helm)
    assert not objects(plain, "Rollout") and not objects(plain, "AnalysisTemplate")
    assert workload(plain)["spec"]["replicas"] == 1
    no_gate = rendered(helm, **{"rollout.strategy": "blueGreen", "rollout.analysis.enabled": "false"})
    assert not objects(no_gate, "AnalysisTemplate")
    assert "prePromotionAnalysis" not in objects(no_gate, "Rollout")[0]["spec"]["strategy"]["blueGreen"]


def test_a_rollout_of_a_statefulset_is_refused(helm: Path) -> None:  # noqa: F811
    result = template(helm, sets={"rollout.strategy": "canary", "workload.kind": "StatefulSet"}, check=False)
    assert result.returncode != 0 and "rollout.strategy needs workload.kind Deployment" in result.stderr


def test_a_rollout_on_a_single_node_cache_claim_is_refused_with_the_fix(helm: Path) -> None:  # noqa: F811
    """Blue-green and canary run the old and new pods together: on a ReadWriteOnce claim (the default) a new pod
    on another node never starts (Multi-Attach error), even with one replica."""
    for strategy in ("blueGreen", "canary"):
        result = template(helm, sets={"rollout.strategy": strategy, "metrics.podMonitor.enabled": "true"}, check=False)
        assert result.returncode != 0 and f"rollout.strategy={strategy}" in result.stderr
        assert "Multi-Attach" in result.stderr and "[ReadWriteMany]" in result.stderr


def test_blue_green_analysis_reads_series_of_every_preview_pod_and_a_quiet_p99_passes(helm: Path) -> None:  # noqa: F811
    """The -preview Service has no metrics port, and after promotion selects the same pods as the active one: a
    ServiceMonitor never scrapes the previewed pods, so the pre-promotion queries come back empty and abort.
    The chart refuses it and names the PodMonitor. Preview pods get only the canary's requests: their p99 is
    NaN or absent, which is no slow answer (Argo Rollouts' documented guards)."""
    refused = template(helm, sets={**SHARED, "rollout.strategy": "blueGreen", "metrics.serviceMonitor.enabled": "true"},
                       check=False)
    assert refused.returncode != 0 and "metrics.podMonitor.enabled=true" in refused.stderr
    rendered(helm, **{"rollout.strategy": "canary", "metrics.serviceMonitor.enabled": "true"})  # one Service: fine
    docs = rendered(helm, **{"rollout.strategy": "blueGreen", "metrics.podMonitor.enabled": "true"})
    (monitor,) = objects(docs, "PodMonitor")
    assert "rollouts-pod-template-hash" in monitor["spec"]["podTargetLabels"]
    p99 = next(m for m in objects(docs, "AnalysisTemplate")[0]["spec"]["metrics"] if m["name"] == "p99-ms")
    assert p99["successCondition"] == "len(result) == 0 || isNaN(result[0]) || result[0] <= 500"


def test_the_analysis_canary_job_runs_like_the_test_pod_on_the_servers_nodes(helm: Path) -> None:  # noqa: F811
    """The Job pulls the serving image from the same registry (pull secrets), under the same security contexts,
    on the GPU nodes (nodeSelector, tolerations) where the image is cached, with bounded resources."""
    docs = rendered(helm, **{"rollout.strategy": "canary", "imagePullSecrets[0].name": "ngc-registry",
                             "nodeSelector.pool": "gpu", "tests.resources.limits.memory": "300Mi"})
    (analysis,) = objects(docs, "AnalysisTemplate")
    validate(analysis)
    job = next(m for m in analysis["spec"]["metrics"] if m["name"] == "canary")["provider"]["job"]
    spec = job["spec"]["template"]["spec"]
    (test_pod,) = objects(docs, "Pod")
    for key in ("imagePullSecrets", "securityContext", "nodeSelector", "tolerations", "automountServiceAccountToken"):
        assert spec[key] == test_pod["spec"][key], key
    assert spec["imagePullSecrets"] == [{"name": "ngc-registry"}] and spec["nodeSelector"] == {"pool": "gpu"}
    (container,) = spec["containers"]
    (tester,) = test_pod["spec"]["containers"]
    assert container["securityContext"] == tester["securityContext"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["resources"] == tester["resources"] and container["resources"]["limits"]["memory"] == "300Mi"
    assert container["image"] == tester["image"]
    as_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "canary"}, "spec": job["spec"]}
    kubernetes_validate.validate(as_job, "1.29", strict=True)


def test_with_tenants_the_analysis_canary_sends_a_tenants_key_and_fails_on_any_refusal(helm: Path) -> None:  # noqa: F811
    """Through the edge with tenants on, the canary's inferences were answered 401 and counted as refusals,
    not failures: the gate passed having checked nothing. It now must answer (--strict), with the key of
    tests.tenantKey; without that Secret the chart refuses the combination."""
    tenants = {"rollout.strategy": "canary", "metrics.podMonitor.enabled": "true", "gateway.enabled": "true",
               "gateway.tenants.existingSecret": "tenants"}
    result = template(helm, sets={**SHARED, **tenants}, check=False)
    assert result.returncode != 0 and "needs tests.tenantKey.existingSecret" in result.stderr
    docs = rendered(helm, **tenants, **{"tests.tenantKey.existingSecret": "canary-tenant"})
    (analysis,) = objects(docs, "AnalysisTemplate")
    validate(analysis)
    (container,) = next(m for m in analysis["spec"]["metrics"] if m["name"] == "canary")["provider"]["job"]["spec"][
        "template"]["spec"]["containers"]
    command = container["command"]
    assert "--strict" in command and command[command.index("--bearer-env") + 1] == "TRITONBUNDLE_CANARY_KEY"
    (key,) = [e for e in container["env"] if e["name"] == "TRITONBUNDLE_CANARY_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "canary-tenant", "key": "key"}
    plain = next(m for m in objects(rendered(helm, **{"rollout.strategy": "canary", "metrics.podMonitor.enabled": "true"}),
                                    "AnalysisTemplate")[0]["spec"]["metrics"] if m["name"] == "canary")
    (container,) = plain["provider"]["job"]["spec"]["template"]["spec"]["containers"]
    assert "--strict" in container["command"] and "--bearer-env" not in container["command"]


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes' label selector semantics for matchLabels and the In/NotIn/Exists/DoesNotExist expressions."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op = e["key"], e["operator"]
        holds = {"Exists": key in labels, "DoesNotExist": key not in labels,
                 "In": key in labels and labels[key] in e["values"],
                 "NotIn": key not in labels or labels[key] not in e["values"]}[op]
        if not holds:
            return False
    return True


def test_the_pdb_and_the_spread_count_the_serving_pods_not_the_callers(helm: Path) -> None:  # noqa: F811
    """The analysis Job's pod and the helm test pod share the selector labels: a PodDisruptionBudget that
    selected the Job's pod finds no scale for its owner and allows no disruption (node drains stall)."""
    docs = rendered(helm, **{"rollout.strategy": "canary", "topologySpreadConstraints[0].maxSkew": "1",
                             "topologySpreadConstraints[0].topologyKey": "kubernetes.io/hostname",
                             "topologySpreadConstraints[0].whenUnsatisfiable": "ScheduleAnyway",
                             # a component of the user's own on the serving pods (podLabels) is theirs to give
                             "podLabels.app\\.kubernetes\\.io/component": "inference"})
    (pdb,) = objects(docs, "PodDisruptionBudget")
    pod = workload(docs)["spec"]["template"]
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    (analysis,) = objects(docs, "AnalysisTemplate")
    job = next(m for m in analysis["spec"]["metrics"] if m["name"] == "canary")["provider"]["job"]["spec"]["template"]
    (test_pod,) = objects(docs, "Pod")
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "inference"
    for selector in (pdb["spec"]["selector"], spread["labelSelector"]):
        assert _selects(selector, pod["metadata"]["labels"])
        assert not _selects(selector, job["metadata"]["labels"]) and not _selects(selector, test_pod["metadata"]["labels"])


def test_migrating_a_serving_deployment_keeps_its_pods_until_the_rollout_is_healthy(helm: Path) -> None:  # noqa: F811
    """Turning the Rollout on set the Deployment to 0 replicas in the same apply: no serving pod while the
    Rollout's first pods built engines. Migrating, the Deployment keeps them and Argo scales it down."""
    for strategy in ("canary", "blueGreen"):
        docs = rendered(helm, **{"rollout.strategy": strategy, "rollout.migrateFromDeployment": "true",
                                 "metrics.podMonitor.enabled": "true"})
        (rollout,) = objects(docs, "Rollout")
        validate(rollout)
        assert rollout["spec"]["workloadRef"]["scaleDown"] == "onsuccess"
        assert workload(docs)["spec"]["replicas"] == rollout["spec"]["replicas"] == 2
    settled = rendered(helm, **{"rollout.strategy": "canary"})
    assert objects(settled, "Rollout")[0]["spec"]["workloadRef"]["scaleDown"] == "never"
    assert workload(settled)["spec"]["replicas"] == 0
