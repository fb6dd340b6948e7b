"""Write the compose stack's Grafana dashboard from the Helm chart's, so both show the same panels.

    python3 docker/monitoring/make-dashboard.py            write docker/monitoring/grafana/dashboards/tritonbundle.json
    python3 docker/monitoring/make-dashboard.py --check    exit 1 if the written file is out of date

The chart's queries select series by Kubernetes labels (namespace, app_kubernetes_io_instance, pod). Here
Prometheus scrapes the `triton` service itself (job "triton"), so those become job="triton" and the
`instance` label (one per Triton container); the gateway's series (tritonbundle_gateway_*) job="gateway".
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE = ROOT / "helm" / "tritonbundle" / "dashboards" / "tritonbundle.json"
TARGET = HERE / "grafana" / "dashboards" / "tritonbundle.json"

SELECTOR = re.compile(r'namespace="\$namespace",\s*app_kubernetes_io_instance=~"\$release"')


def convert_text(text: str) -> str:
    # The gateway's series come from the `gateway` service (job "gateway"), Triton's from `triton`.
    job = "gateway" if "tritonbundle_gateway_" in text else "triton"
    text = SELECTOR.sub(f'job="{job}",instance=~"$instance"', text)
    text = re.sub(r"\bpod\b", "instance", text)
    text = text.replace("Serving pods", "Serving instances").replace("per pod", "per instance")
    return text


def walk(value: object) -> object:
    if isinstance(value, str):
        return convert_text(value)
    if isinstance(value, list):
        return [walk(v) for v in value]
    if isinstance(value, dict):
        return {k: walk(v) for k, v in value.items()}
    return value


def convert(board: dict) -> dict:
    board = walk(board)  # type: ignore[assignment]
    board["uid"] = "tritonbundle-compose"
    board["title"] = f"{board['title']} (docker compose)"
    board["description"] = (
        "Triton serving the tritonbundle model repository under docker compose: queue vs compute time, "
        "throughput, batch sizes, GPU utilisation and memory. Generated from the Helm chart's dashboard by "
        "docker/monitoring/make-dashboard.py."
    )
    variables = []
    for var in board["templating"]["list"]:
        if var["name"] in ("namespace", "release"):
            continue
        if var["name"] == "model":
            query = 'label_values(nv_inference_request_success{job="triton",instance=~"$instance"}, model)'
            var["query"] = {"query": query, "refId": "model-var"}
            var["definition"] = query
        variables.append(var)
    query = 'label_values(nv_inference_request_success{job="triton"}, instance)'
    instance = {
        "name": "instance", "label": "Triton instance", "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": "instance-var"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "regex": "", "hide": 0,
        "current": {}, "options": [], "allValue": ".*",
    }
    variables.insert(1, instance)
    board["templating"]["list"] = variables
    leftover = re.findall(r"namespace|app_kubernetes_io|\$release", json.dumps(board))
    if leftover:
        raise SystemExit(f"make-dashboard.py: Kubernetes labels left in the dashboard: {sorted(set(leftover))}")
    return board


def render() -> str:
    return json.dumps(convert(json.loads(SOURCE.read_text())), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run python3 docker/monitoring/make-dashboard.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
