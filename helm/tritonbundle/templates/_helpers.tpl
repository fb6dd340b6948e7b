{{/*
Names
*/}}
{{- define "tritonbundle.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tritonbundle.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tritonbundle.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tritonbundle.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels
*/}}
{{- define "tritonbundle.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tritonbundle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The serving pods alone, as a label selector: the pods that call the release from beside it (the `helm test`
pod, the Rollout analysis's canary Job; tritonbundle.callerLabels) share the selector labels and carry
their component. A PodDisruptionBudget that selected the Job's pod would find no scale for its owner and
allow no disruption at all (kubernetes/kubernetes#129625): node drains would stall. NotIn, not
DoesNotExist: a user's podLabels may give the serving pods a component of their own.
*/}}
{{- define "tritonbundle.serverPodSelector" -}}
matchLabels:
  {{- include "tritonbundle.selectorLabels" . | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: NotIn
    values: [test, rollout-analysis]
{{- end }}

{{- define "tritonbundle.labels" -}}
helm.sh/chart: {{ include "tritonbundle.chart" . }}
{{ include "tritonbundle.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tritonbundle
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tritonbundle.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tritonbundle.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Images: registry/repository:tag[@digest]. A tag is always present (no implicit "latest").
Call with (dict "image" <image values> "defaultTag" <tag> "global" .Values.global).
*/}}
{{- define "tritonbundle.imageRef" -}}
{{- $registry := .image.registry | default "" }}
{{- if .global.imageRegistry }}{{ $registry = .global.imageRegistry }}{{ end }}
{{- $tag := .image.tag | default .defaultTag | toString }}
{{- if not $tag }}{{ fail (printf "image %s has no tag; set a tag (never latest)" .image.repository) }}{{ end }}
{{- if eq $tag "latest" }}{{ fail (printf "image %s: the tag 'latest' is not allowed; pin a version" .image.repository) }}{{ end }}
{{- $ref := printf "%s:%s" .image.repository $tag }}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $ref }}{{ end }}
{{- if .image.digest }}{{ $ref = printf "%s@%s" $ref .image.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{- define "tritonbundle.image" -}}
{{- include "tritonbundle.imageRef" (dict "image" .Values.image "defaultTag" "" "global" .Values.global) }}
{{- end }}

{{/*
The NGC release of the serving image: the leading YY.MM of image.tag ("26.07-py3" -> "26.07"); empty when
the tag does not start with one (a custom serving image).
*/}}
{{- define "tritonbundle.ngcRelease" -}}
{{- regexFind "^[0-9][0-9]\\.[0-9][0-9]" (.Values.image.tag | default "" | toString) }}
{{- end }}

{{/*
The build image makes the plans, so its TensorRT must be the server's: its default tag names the NGC release
of image.tag too, <appVersion>-ngc<YY.MM> (the tag docker/ gives the build image of that release).
*/}}
{{- define "tritonbundle.buildImage" -}}
{{- $tag := .Values.engineBuild.image.tag | default "" | toString }}
{{- if not $tag }}
{{- $release := include "tritonbundle.ngcRelease" . }}
{{- if not $release }}
{{- fail (printf "engineBuild.image.tag is empty and image.tag %q does not start with an NGC release (YY.MM, as in 26.07-py3) to derive it from: set engineBuild.image.tag to the build image built on the NGC TensorRT image of the serving image's release" (toString .Values.image.tag)) }}
{{- end }}
{{- $tag = printf "%s-ngc%s" .Chart.AppVersion $release }}
{{- end }}
{{- include "tritonbundle.imageRef" (dict "image" .Values.engineBuild.image "defaultTag" $tag "global" .Values.global) }}
{{- end }}

{{/*
A container command started through NVIDIA's entry point (values nvidiaEntrypoint), as the NGC images start
theirs: call with (dict "root" $ "command" (list ...)); renders a JSON list.
*/}}
{{- define "tritonbundle.command" -}}
{{- $command := .command }}
{{- with .root.Values.nvidiaEntrypoint }}{{ $command = prepend $command . }}{{ end }}
{{- toJson $command }}
{{- end }}

{{- define "tritonbundle.edgeImage" -}}
{{- include "tritonbundle.imageRef" (dict "image" .Values.edge.image "defaultTag" "" "global" .Values.global) }}
{{- end }}

{{/*
The edge (edge.enabled): nginx in a sidecar, in front of Triton's HTTP and gRPC ports, which Triton then binds
to 127.0.0.1. Its listening ports are fixed in its nginx.conf (files/edge-nginx.conf).
*/}}
{{- define "tritonbundle.edgeHttpPort" -}}8080{{- end }}
{{- define "tritonbundle.edgeGrpcPort" -}}8081{{- end }}

{{/* settings.conf of the edge: files/edge-settings.conf.template filled in for this pod. */}}
{{- define "tritonbundle.edgeSettings" -}}
{{- .Files.Get "files/edge-settings.conf.template"
    | replace "@TRITON_HTTP@" (printf "127.0.0.1:%d" (int .Values.server.ports.http))
    | replace "@TRITON_GRPC@" (printf "127.0.0.1:%d" (int .Values.server.ports.grpc))
    | replace "@MAX_BODY@" (toString .Values.edge.maxBodySize)
    | replace "@GATEWAY_ADDRESS@" (ternary (printf "127.0.0.1:%d" (int .Values.gateway.port)) "127.0.0.1:9" .Values.gateway.enabled)
    | replace "@GATEWAY@" (ternary (printf "127.0.0.1:%d" (int .Values.gateway.port)) "off" .Values.gateway.enabled)
    | replace "@TENANTS@" (ternary "on" "off" (and .Values.gateway.enabled (ne .Values.gateway.tenants.existingSecret ""))) }}
{{- end }}

{{- define "tritonbundle.gatewayImage" -}}
{{- include "tritonbundle.imageRef" (dict "image" .Values.gateway.image "defaultTag" .Chart.AppVersion "global" .Values.global) }}
{{- end }}

{{/*
A probe on one of Triton's health endpoints. Without the edge: httpGet on the http port. With it Triton's HTTP
port listens on 127.0.0.1 only, which the kubelet's httpGet cannot reach: the same request from inside the
container (python3 is in the Triton images; the canary uses it too). Call with (dict "path" ... "timeout" ...
"root" $).
*/}}
{{- define "tritonbundle.healthProbe" -}}
{{- if .root.Values.edge.enabled }}
exec:
  command:
    - python3
    - -c
    - "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))"
    - {{ printf "http://127.0.0.1:%d%s" (int .root.Values.server.ports.http) .path | quote }}
    - {{ .timeout | quote }}
{{- else }}
httpGet:
  path: {{ .path }}
  port: http
{{- end }}
{{- end }}

{{- define "tritonbundle.testImage" -}}
{{- if .Values.tests.image.repository }}
{{- include "tritonbundle.imageRef" (dict "image" .Values.tests.image "defaultTag" "" "global" .Values.global) }}
{{- else }}
{{- include "tritonbundle.image" . }}
{{- end }}
{{- end }}

{{- define "tritonbundle.imagePullSecrets" -}}
{{- $secrets := concat (.Values.global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list) }}
{{- with $secrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The pods that call the release from beside it: the `helm test` pod (component test) and the canary Job of the
Rollout's analysis (component rollout-analysis), which the NetworkPolicy lets in by these labels. They run
the serving image (or tests.image) on the server's nodes, where it is cached, under the server's pull secrets
and security contexts, with tests.resources and no GPU. Call with (dict "root" $ "component" <component>).
*/}}
{{- define "tritonbundle.callerLabels" -}}
{{ include "tritonbundle.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Their pod spec's settings (besides restartPolicy, containers and volumes). */}}
{{- define "tritonbundle.callerPodSettings" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with (include "tritonbundle.imagePullSecrets" .) }}
{{ . | trim }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Their container's image, security context and resources. */}}
{{- define "tritonbundle.callerContainerSettings" -}}
image: {{ include "tritonbundle.testImage" . }}
imagePullPolicy: IfNotPresent
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
resources:
  {{- toYaml .Values.tests.resources | nindent 2 }}
{{- end }}

{{/*
Workload
*/}}
{{- define "tritonbundle.isStatefulSet" -}}
{{- if eq .Values.workload.kind "StatefulSet" }}true{{ end }}
{{- end }}

{{/* The largest number of replicas that can run: decides the PDB and the volume checks. */}}
{{- define "tritonbundle.maxReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.maxReplicas }}{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{- define "tritonbundle.pdbEnabled" -}}
{{- if and .Values.pdb.enabled (gt (int (include "tritonbundle.maxReplicas" .)) 1) }}true{{ end }}
{{- end }}

{{/*
Model repository
*/}}
{{- define "tritonbundle.engineBuildEnabled" -}}
{{- if and .Values.engineBuild.enabled (eq .Values.modelRepository.source "pvc") }}true{{ end }}
{{- end }}

{{- define "tritonbundle.pvcName" -}}
{{- default (printf "%s-model-cache" (include "tritonbundle.fullname" .)) .Values.modelRepository.pvc.existingClaim }}
{{- end }}

{{/* True when the chart renders a standalone PersistentVolumeClaim object (not a volumeClaimTemplate). */}}
{{- define "tritonbundle.createPvc" -}}
{{- if and (eq .Values.modelRepository.source "pvc") (not .Values.modelRepository.pvc.existingClaim) (not (include "tritonbundle.isStatefulSet" .)) }}true{{ end }}
{{- end }}

{{/*
True when the chart's own model cache claim (createPvc) can be mounted on one node only (accessModes without
ReadWriteMany): a pod on another node waits on a Multi-Attach error while the old pod holds it.
*/}}
{{- define "tritonbundle.singleNodeClaim" -}}
{{- if and (include "tritonbundle.createPvc" .) (not (has "ReadWriteMany" .Values.modelRepository.pvc.accessModes)) }}true{{ end }}
{{- end }}

{{/*
The Deployment's update strategy: deployment.strategy, or when empty {maxSurge 1, maxUnavailable 0} (serving
capacity kept) with a claim every node can mount and {maxSurge 0, maxUnavailable 1} with a single-node claim
(the new pod can only start once the old one let the volume go).
*/}}
{{- define "tritonbundle.deploymentStrategy" -}}
{{- if .Values.deployment.strategy }}
{{- toYaml .Values.deployment.strategy }}
{{- else }}
{{- $surge := ternary 0 1 (eq (include "tritonbundle.singleNodeClaim" .) "true") }}
{{- toYaml (dict "type" "RollingUpdate" "rollingUpdate" (dict "maxSurge" $surge "maxUnavailable" (sub 1 $surge))) }}
{{- end }}
{{- end }}

{{/* The folder of your own models on the volume (engineBuild.userModels.path): the manifest and its files. */}}
{{- define "tritonbundle.userModelsDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.modelRepository.pvc.mountPath) .Values.engineBuild.userModels.path }}
{{- end }}

{{/* The manifest engine-build builds from: your own (engineBuild.userModels) on the volume, else the build image's. */}}
{{- define "tritonbundle.manifest" -}}
{{- if .Values.engineBuild.userModels.source }}
{{- printf "%s/%s" (include "tritonbundle.userModelsDir" .) .Values.engineBuild.userModels.manifest }}
{{- else }}
{{- .Values.engineBuild.manifest }}
{{- end }}
{{- end }}

{{/* Where the engine-build init container leaves a link to <volume>/engines/<fingerprint>/model_repository. */}}
{{- define "tritonbundle.runDir" -}}/run/tritonbundle{{- end }}

{{- define "tritonbundle.modelRepositoryUrl" -}}
{{- $repo := .Values.modelRepository }}
{{- if eq $repo.source "s3" }}
{{- if $repo.s3.endpoint }}
{{- printf "s3://%s/%s" (trimSuffix "/" $repo.s3.endpoint) (trimPrefix "/" $repo.s3.path) }}
{{- else }}
{{- printf "s3://%s" (trimPrefix "/" $repo.s3.path) }}
{{- end }}
{{- else if eq $repo.source "image" }}
{{- $repo.image.path }}
{{- else if include "tritonbundle.engineBuildEnabled" . }}
{{- printf "%s/model_repository" (include "tritonbundle.runDir" .) }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" $repo.pvc.mountPath) $repo.pvc.repositoryPath }}
{{- end }}
{{- end }}

{{/*
The canary the liveness and readiness probes exec (files/canary.py, mounted from the scripts ConfigMap):
every served model gets its smallest real request on the container's own HTTP port. The models: those of
probes.canary.models; else, with explicit model control, server.loadModels (unless "*"); else every model
folder of the repository the server reads (source pvc or image: a path inside the pod; s3 needs models).
With model control (poll, explicit) a model may be in the repository and not loaded (a folder copied in
before the next poll, one that failed to load, one unloaded): --loaded probes only those Triton's repository
index reports READY, with the restricted API's key when that API is restricted (the container's
TRITONBUNDLE_API_KEY), so such a model takes down neither the pod nor the other models.
*/}}
{{- define "tritonbundle.canaryCommand" -}}
{{- $v := .Values }}
{{- /* The whole check ends 2 s inside the shorter probe timeout (a probe the kubelet times out is a failure):
     a model after the first is asked only while its worst case fits, the others are busy, not down
     (canary.py --deadline-s; tritonbundle.validate checks the first model fits). */}}
{{- $deadline := sub (min (int $v.probes.liveness.timeoutSeconds) (int $v.probes.readiness.timeoutSeconds)) 2 }}
{{- $cmd := list "python3" "/opt/tritonbundle/scripts/canary.py" "--url" (printf "http://127.0.0.1:%d" (int $v.server.ports.http)) "--timeout-s" (toString $v.probes.canary.requestTimeoutSeconds) "--deadline-s" (toString $deadline) "--metrics-url" (printf "http://127.0.0.1:%d/metrics" (int $v.server.ports.metrics)) "--server-cpu" }}
{{- $models := $v.probes.canary.models }}
{{- if and (not $models) (eq $v.server.modelControlMode "explicit") (not (has "*" $v.server.loadModels)) }}
{{- $models = $v.server.loadModels }}
{{- end }}
{{- if $models }}
{{- range $models }}
{{- $cmd = append (append $cmd "--model") . }}
{{- end }}
{{- else }}
{{- $cmd = append (append $cmd "--repository") (include "tritonbundle.modelRepositoryUrl" .) }}
{{- end }}
{{- if ne $v.server.modelControlMode "none" }}
{{- $cmd = append $cmd "--loaded" }}
{{- if and $v.restrictedApi.enabled (has "model-repository" $v.restrictedApi.apis) }}
{{- $cmd = append (append $cmd "--api-header") $v.restrictedApi.headerName }}
{{- end }}
{{- end }}
{{- toJson $cmd }}
{{- end }}

{{/*
Restricted API key
*/}}
{{- define "tritonbundle.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "tritonbundle.fullname" .)) .Values.restrictedApi.existingSecret }}
{{- end }}

{{/*
PromQL: the label matchers that select this release's Triton series. The ServiceMonitor/PodMonitor copy
the pod labels app.kubernetes.io/{name,instance} onto every series (podTargetLabels).
*/}}
{{- define "tritonbundle.promSelector" -}}
namespace="{{ include "tritonbundle.namespace" . }}",app_kubernetes_io_instance="{{ .Release.Name }}",app_kubernetes_io_name="{{ include "tritonbundle.name" . }}"
{{- end }}

{{/* Sum over pods of each pod's queue/compute time ratio (for KEDA's AverageValue target). */}}
{{- define "tritonbundle.kedaQuery" -}}
{{- if .Values.autoscaling.keda.query }}
{{- .Values.autoscaling.keda.query }}
{{- else }}
{{- $sel := printf "%s,model=~\"%s\"" (include "tritonbundle.promSelector" .) .Values.autoscaling.models }}
{{- $w := .Values.autoscaling.rateWindow }}
{{- if eq .Values.autoscaling.target "requestsPerSecond" }}
{{- printf "sum(rate(nv_inference_request_success{%s}[%s]))" $sel $w }}
{{- else }}
{{- printf "sum(sum by (pod) (rate(nv_inference_queue_duration_us{%s}[%s])) / clamp_min(sum by (pod) (rate(nv_inference_compute_infer_duration_us{%s}[%s])), 1))" $sel $w $sel $w }}
{{- end }}
{{- end }}
{{- end }}

{{/*
checksum/config: the configuration the pod reads from ConfigMaps and Secrets, so a change rolls the pods.
The generated API key is left out (it is random at render time and read back from the cluster afterwards).
*/}}
{{- define "tritonbundle.configChecksum" -}}
{{- $config := dict
  "buildScript" (include (print $.Template.BasePath "/configmap.yaml") .)
  "edge" (include (print $.Template.BasePath "/edge-configmap.yaml") .)
  "apiKey" .Values.restrictedApi.key
  "apiKeySecret" (include "tritonbundle.apiKeySecretName" .)
  "apiKeySecretKey" .Values.restrictedApi.existingSecretKey
  "s3Credentials" .Values.modelRepository.s3.credentials
}}
{{- toJson $config | sha256sum }}
{{- end }}

{{/*
Checks that values.schema.json cannot express. Included by the workload template.
*/}}
{{- define "tritonbundle.validate" -}}
{{- $v := .Values }}
{{- $grace := int $v.terminationGracePeriodSeconds }}
{{- $exit := int $v.server.exitTimeoutSeconds }}
{{- $sleep := int $v.lifecycle.preStopSleepSeconds }}
{{- if le $grace (add $exit $sleep) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than server.exitTimeoutSeconds (%d) + lifecycle.preStopSleepSeconds (%d), or Kubernetes kills Triton before in-flight requests finish" $grace $exit $sleep) }}
{{- end }}
{{- if and $v.engineBuild.enabled (ne $v.modelRepository.source "pvc") }}
{{- fail (printf "engineBuild.enabled needs modelRepository.source=pvc (engines are written to the volume); with source=%s set engineBuild.enabled=false and provide plans built for the nodes' GPU" $v.modelRepository.source) }}
{{- end }}
{{- with $v.engineBuild.userModels }}
{{- if and .source (not (include "tritonbundle.engineBuildEnabled" $)) }}
{{- fail (printf "engineBuild.userModels.source=%s is read by the engine-build init container: it needs engineBuild.enabled=true and modelRepository.source=pvc" .source) }}
{{- end }}
{{- if and (eq .source "url") (not .url.location) (not .url.credentials.existingSecret) }}
{{- fail "engineBuild.userModels.source=url needs the archive's URL: engineBuild.userModels.url.location, or a Secret holding it (url.credentials.existingSecret, entry url.credentials.urlKey)" }}
{{- end }}
{{- if and .source (eq (first (splitList "/" .path)) "engines") }}
{{- fail "engineBuild.userModels.path must not be under engines/ (the engine cache of every GPU fingerprint)" }}
{{- end }}
{{- end }}
{{- if and (eq $v.modelRepository.source "s3") (not $v.modelRepository.s3.path) }}
{{- fail "modelRepository.s3.path is required when modelRepository.source=s3 (bucket/prefix, no scheme)" }}
{{- end }}
{{- if $v.probes.canary.enabled }}
{{- /* canary.py: one model's worst case is 4 request timeouts (MODEL_TIMEOUTS), and one more for the first metrics read. */}}
{{- $probe := min (int $v.probes.liveness.timeoutSeconds) (int $v.probes.readiness.timeoutSeconds) }}
{{- $needs := mulf 5 (float64 $v.probes.canary.requestTimeoutSeconds) }}
{{- if lt (float64 (sub $probe 2)) $needs }}
{{- fail (printf "probes.liveness/readiness.timeoutSeconds (%d) must leave the canary 2 s plus 5 x probes.canary.requestTimeoutSeconds (%v s) for one model's requests: a probe the kubelet times out counts as failed. Raise the timeouts or lower requestTimeoutSeconds (at least 2: a dead stub's 500 comes after its 1 s check)" $probe $needs) }}
{{- end }}
{{- end }}
{{- if and $v.probes.canary.enabled (eq $v.modelRepository.source "s3") (not $v.probes.canary.models) (not (and (eq $v.server.modelControlMode "explicit") (not (has "*" $v.server.loadModels)))) }}
{{- fail "probes.canary with modelRepository.source=s3 needs the models to probe in probes.canary.models (the repository is in the bucket, not in the pod), or probes.canary.enabled=false for the httpGet probes" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled $v.metrics.podMonitor.enabled }}
{{- fail "enable metrics.serviceMonitor or metrics.podMonitor, not both (every series would be scraped twice)" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (eq $v.rollout.strategy "blueGreen") }}
{{- fail "rollout.strategy=blueGreen with metrics.serviceMonitor: the new pods sit behind the -preview Service only, and after promotion both Services select the same pods (each scraped twice, every sum doubled), so the pre-promotion analysis has no series to read: use metrics.podMonitor.enabled=true (and metrics.serviceMonitor.enabled=false), which scrapes every pod once" }}
{{- end }}
{{- if and $v.autoscaling.enabled (lt (int $v.autoscaling.maxReplicas) (int $v.autoscaling.minReplicas)) }}
{{- fail (printf "autoscaling.maxReplicas (%d) must be >= autoscaling.minReplicas (%d)" (int $v.autoscaling.maxReplicas) (int $v.autoscaling.minReplicas)) }}
{{- end }}
{{- if and (include "tritonbundle.createPvc" .) (gt (int (include "tritonbundle.maxReplicas" .)) 1) (not (has "ReadWriteMany" $v.modelRepository.pvc.accessModes)) }}
{{- fail "a Deployment with more than one replica shares one model cache claim: set modelRepository.pvc.accessModes to [ReadWriteMany], or workload.kind=StatefulSet (one claim per replica), or an existingClaim" }}
{{- end }}
{{- if include "tritonbundle.singleNodeClaim" . }}
{{- if ne $v.rollout.strategy "none" }}
{{- fail (printf "rollout.strategy=%s runs the new pods beside the old ones, but the model cache claim is %s (one node: a new pod on another node never starts, Multi-Attach error): set modelRepository.pvc.accessModes to [ReadWriteMany], or an existingClaim every node can mount, or rollout.strategy=none" $v.rollout.strategy (join "," $v.modelRepository.pvc.accessModes)) }}
{{- end }}
{{- $strategy := $v.deployment.strategy | default dict }}
{{- $surge := dig "rollingUpdate" "maxSurge" "25%" $strategy | toString }}
{{- if and $strategy (ne (get $strategy "type" | default "RollingUpdate") "Recreate") (not (has $surge (list "0" "0%"))) }}
{{- fail (printf "deployment.strategy surges (maxSurge %s), but the model cache claim is %s (one node): the surge pod lands on another node and never starts (Multi-Attach error), stalling the rollout. Set deployment.strategy.rollingUpdate to {maxSurge: 0, maxUnavailable: 1} (or leave deployment.strategy empty), or modelRepository.pvc.accessModes to [ReadWriteMany]" $surge (join "," $v.modelRepository.pvc.accessModes)) }}
{{- end }}
{{- end }}
{{- if $v.edge.enabled }}
{{- range $name, $port := $v.server.ports }}
{{- if has (int $port) (list 8080 8081) }}
{{- fail (printf "server.ports.%s is %d, a port of the edge (8080 HTTP, 8081 gRPC, fixed in its nginx.conf): pick another port for Triton" $name (int $port)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq $v.server.modelControlMode "explicit") (not $v.server.loadModels) }}
{{- fail "server.modelControlMode=explicit loads nothing at start: list the models in server.loadModels ([\"*\"] for all)" }}
{{- end }}
{{- end }}
