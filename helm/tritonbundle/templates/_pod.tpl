{{/*
The pod template shared by the Deployment and the StatefulSet.
*/}}
{{- define "tritonbundle.gpuResources" -}}
{{- $res := deepCopy (.resources | default dict) }}
{{- $limits := deepCopy (get $res "limits" | default dict) }}
{{- $_ := set $limits .gpu.resourceName (int .gpu.count) }}
{{- $_ := set $res "limits" $limits }}
{{- toYaml $res }}
{{- end }}

{{/*
The preStop hook of every serving container (tritonserver, edge, gateway): keep answering while the endpoints
and load balancers stop sending traffic, before the container gets its SIGTERM.
*/}}
{{- define "tritonbundle.preStop" -}}
preStop:
  exec:
    command: ["/bin/sleep", {{ .Values.lifecycle.preStopSleepSeconds | quote }}]
{{- end }}

{{/*
The gateway's command: wait (python3, in the gateway image) until Triton in the same pod is ready, at most
probes.startup.budgetSeconds, then exec `tritonbundle gateway`, which checks its models at start within its
own --timeout-s (30 s: also its deadline per call, so not stretched to the startup budget). Without the wait
the gateway exits while Triton loads and crash-loops (backing off up to 5 minutes after Triton is ready).
*/}}
{{- define "tritonbundle.gatewayWait" -}}
import os, sys, time, urllib.request
url, budget, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
deadline = time.monotonic() + budget
while True:
    try:
        urllib.request.urlopen(url, timeout=5).close()
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"gateway: Triton at {url} is not ready after {budget:g} s (probes.startup.budgetSeconds): {e}")
        time.sleep(2)
print(f"gateway: Triton at {url} is ready", flush=True)
os.execvp(argv[0], argv)
{{- end }}

{{- define "tritonbundle.podTemplate" -}}
{{- $v := .Values }}
{{- $engineBuild := include "tritonbundle.engineBuildEnabled" . }}
{{- $source := $v.modelRepository.source -}}
metadata:
  annotations:
    checksum/config: {{ include "tritonbundle.configChecksum" . }}
    kubectl.kubernetes.io/default-container: tritonserver
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "tritonbundle.labels" . | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "tritonbundle.serviceAccountName" . }}
  automountServiceAccountToken: {{ $v.serviceAccount.automountServiceAccountToken }}
  {{- with (include "tritonbundle.imagePullSecrets" .) }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $v.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  enableServiceLinks: false
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- if or $v.pythonPackages.enabled $engineBuild $v.extraInitContainers }}
  initContainers:
    {{- if $v.pythonPackages.enabled }}
    - name: python-packages
      image: {{ include "tritonbundle.buildImage" . }}
      imagePullPolicy: {{ $v.engineBuild.image.pullPolicy }}
      command: ["python3", "/opt/tritonbundle/scripts/copy-python-packages.py", {{ $v.pythonPackages.mountPath | quote }}]
      args:
        {{- toYaml $v.pythonPackages.packages | nindent 8 }}
      env:
        - name: HOME
          value: /tmp
        - name: PYTHONDONTWRITEBYTECODE
          value: "1"
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        requests:
          cpu: 100m
          memory: 128Mi
        limits:
          memory: 512Mi
      volumeMounts:
        - name: scripts
          mountPath: /opt/tritonbundle/scripts
          readOnly: true
        - name: python-packages
          mountPath: {{ $v.pythonPackages.mountPath }}
        - name: tmp
          mountPath: /tmp
    {{- end }}
    {{- if and $engineBuild (eq $v.engineBuild.userModels.source "url") }}
    {{- /* Your own models from a URL (files/fetch-models.py): the archive, checksum-verified and bounded in size and
    time, unpacked into engineBuild.userModels.path on the volume before engine-build reads the manifest there.
    No GPU, no NVIDIA entry point. Credentials come from the Secret only, every entry optional. */}}
    {{- $um := $v.engineBuild.userModels }}
    {{- $cred := $um.url.credentials }}
    - name: fetch-models
      image: {{ include "tritonbundle.buildImage" . }}
      imagePullPolicy: {{ $v.engineBuild.image.pullPolicy }}
      command: ["python3", "/opt/tritonbundle/scripts/fetch-models.py"]
      env:
        - name: TRITONBUNDLE_FETCH_URL
          {{- if $um.url.location }}
          value: {{ $um.url.location | quote }}
          {{- else }}
          valueFrom:
            secretKeyRef:
              name: {{ $cred.existingSecret }}
              key: {{ $cred.urlKey }}
          {{- end }}
        - name: TRITONBUNDLE_FETCH_DEST
          value: {{ include "tritonbundle.userModelsDir" . | quote }}
        - name: TRITONBUNDLE_FETCH_MANIFEST
          value: {{ $um.manifest | quote }}
        - name: TRITONBUNDLE_FETCH_SHA256
          value: {{ $um.url.sha256 | lower | quote }}
        - name: TRITONBUNDLE_FETCH_TIMEOUT_S
          value: {{ int $um.url.timeoutSeconds | quote }}
        - name: TRITONBUNDLE_FETCH_MAX_BYTES
          value: {{ kindIs "string" $um.url.maxSize | ternary $um.url.maxSize (int64 $um.url.maxSize | toString) | quote }}
        - name: TRITONBUNDLE_FETCH_S3_ENDPOINT
          value: {{ $um.url.s3Endpoint | quote }}
        - name: TRITONBUNDLE_FETCH_S3_REGION
          value: {{ $um.url.s3Region | quote }}
        {{- if $cred.existingSecret }}
        {{- range $name, $key := dict "TRITONBUNDLE_FETCH_AUTHORIZATION" $cred.authorizationKey "AWS_ACCESS_KEY_ID" $cred.accessKeyIdKey "AWS_SECRET_ACCESS_KEY" $cred.secretAccessKeyKey "AWS_SESSION_TOKEN" $cred.sessionTokenKey }}
        - name: {{ $name }}
          valueFrom:
            secretKeyRef:
              name: {{ $cred.existingSecret }}
              key: {{ $key }}
              optional: true
        {{- end }}
        {{- end }}
        - name: HOME
          value: /tmp
        - name: PYTHONDONTWRITEBYTECODE
          value: "1"
        {{- with $v.engineBuild.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- toYaml $um.url.resources | nindent 8 }}
      volumeMounts:
        - name: scripts
          mountPath: /opt/tritonbundle/scripts
          readOnly: true
        - name: model-cache
          mountPath: {{ $v.modelRepository.pvc.mountPath }}
        - name: tmp
          mountPath: /tmp
    {{- end }}
    {{- if $engineBuild }}
    - name: engine-build
      image: {{ include "tritonbundle.buildImage" . }}
      imagePullPolicy: {{ $v.engineBuild.image.pullPolicy }}
      command: {{ include "tritonbundle.command" (dict "root" $ "command" (list "/bin/sh" "/opt/tritonbundle/scripts/engine-build.sh")) }}
      {{- $buildArgs := $v.engineBuild.extraArgs | default list }}
      {{- if $v.engineBuild.force }}{{ $buildArgs = prepend $buildArgs "--force" }}{{ end }}
      {{- with $buildArgs }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        - name: TRITONBUNDLE_MANIFEST
          value: {{ include "tritonbundle.manifest" . | quote }}
        {{- with $v.engineBuild.userModels.source }}
        {{- /* Your own models on the volume: engine-build checks that the manifest is there (source=pvc: waits for it). */}}
        - name: TRITONBUNDLE_USER_MODELS
          value: {{ . | quote }}
        - name: TRITONBUNDLE_MANIFEST_WAIT_S
          value: {{ eq . "pvc" | ternary (int $v.engineBuild.userModels.waitSeconds) 0 | quote }}
        {{- end }}
        - name: TRITONBUNDLE_SEED_ARTIFACTS
          value: {{ $v.engineBuild.seedArtifacts | quote }}
        - name: TRITONBUNDLE_CACHE_DIR
          value: {{ printf "%s/engines" (trimSuffix "/" $v.modelRepository.pvc.mountPath) | quote }}
        - name: TRITONBUNDLE_RUN_DIR
          value: {{ include "tritonbundle.runDir" . | quote }}
        - name: TRITONBUNDLE_PRECISION
          value: {{ $v.engineBuild.precision | quote }}
        - name: TRITONBUNDLE_MODELS
          value: {{ join " " $v.engineBuild.models | quote }}
        - name: TRITONBUNDLE_FORCE
          value: {{ $v.engineBuild.force | quote }}
        - name: TRITONBUNDLE_LOCK_TIMEOUT_S
          value: {{ $v.engineBuild.lockTimeoutSeconds | quote }}
        - name: HOME
          value: /tmp
        - name: HF_HUB_OFFLINE
          value: "1"
        - name: CUDA_CACHE_PATH
          value: /tmp/.nv/ComputeCache
        {{- with $v.engineBuild.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- include "tritonbundle.gpuResources" (dict "resources" $v.engineBuild.resources "gpu" $v.gpu) | nindent 8 }}
      volumeMounts:
        - name: scripts
          mountPath: /opt/tritonbundle/scripts
          readOnly: true
        - name: model-cache
          mountPath: {{ $v.modelRepository.pvc.mountPath }}
        - name: run
          mountPath: {{ include "tritonbundle.runDir" . }}
        - name: tmp
          mountPath: /tmp
        - name: shm
          mountPath: /dev/shm
    {{- end }}
    {{- with $v.extraInitContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  containers:
    - name: tritonserver
      image: {{ include "tritonbundle.image" . }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      {{- /* tensorrt-plans.py refuses plans another TensorRT version built (naming both), adds
      --backend-config=tensorrt,version-compatible=true for version-compatible plans, then execs tritonserver
      with these arguments. Kubernetes expands $(TRITONBUNDLE_API_KEY) in them before. */}}
      command: {{ include "tritonbundle.command" (dict "root" $ "command" (list "python3" "/opt/tritonbundle/scripts/tensorrt-plans.py" "exec" "tritonserver")) }}
      args:
        - --model-repository={{ include "tritonbundle.modelRepositoryUrl" . }}
        - --model-control-mode={{ $v.server.modelControlMode }}
        {{- if eq $v.server.modelControlMode "poll" }}
        - --repository-poll-secs={{ $v.server.repositoryPollSeconds }}
        {{- end }}
        {{- if eq $v.server.modelControlMode "explicit" }}
        {{- range $v.server.loadModels }}
        - --load-model={{ . }}
        {{- end }}
        {{- end }}
        - --strict-readiness=true
        - --exit-timeout-secs={{ $v.server.exitTimeoutSeconds }}
        {{- if $v.edge.enabled }}
        {{- /* Behind the edge: HTTP and gRPC on loopback only. Metrics would follow --http-address: keep them on
        every address, for Prometheus. */}}
        - --http-address=127.0.0.1
        - --grpc-address=127.0.0.1
        - --metrics-address=0.0.0.0
        {{- end }}
        - --http-port={{ $v.server.ports.http }}
        - --grpc-port={{ $v.server.ports.grpc }}
        - --metrics-port={{ $v.server.ports.metrics }}
        - --allow-metrics=true
        - --allow-gpu-metrics={{ $v.server.gpuMetrics }}
        - --metrics-interval-ms={{ $v.server.metricsIntervalMs }}
        {{- if and (ne $v.rollout.strategy "none") $v.rollout.analysis.enabled }}
        {{- /* p99 per model for the Rollout's analysis (nv_inference_request_summary_us). */}}
        - --metrics-config=summary_latencies=true
        {{- end }}
        - --log-verbose={{ $v.server.logVerbose }}
        - --log-format={{ $v.server.logFormat }}
        {{- if $v.restrictedApi.enabled }}
        {{- range $v.restrictedApi.apis }}
        - --http-restricted-api={{ . }}:{{ $v.restrictedApi.headerName }}=$(TRITONBUNDLE_API_KEY)
        {{- end }}
        {{- range $v.restrictedApi.apis }}
        - --grpc-restricted-protocol={{ . }}:{{ $v.restrictedApi.headerName }}=$(TRITONBUNDLE_API_KEY)
        {{- end }}
        {{- end }}
        {{- with $v.server.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        - name: HOME
          value: /tmp
        - name: PYTHONDONTWRITEBYTECODE
          value: "1"
        {{- if $v.pythonPackages.enabled }}
        - name: PYTHONPATH
          value: {{ $v.pythonPackages.mountPath | quote }}
        {{- end }}
        {{- if $v.restrictedApi.enabled }}
        - name: TRITONBUNDLE_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ include "tritonbundle.apiKeySecretName" . }}
              key: {{ $v.restrictedApi.existingSecretKey }}
        {{- end }}
        {{- if eq $source "s3" }}
        - name: AWS_DEFAULT_REGION
          value: {{ $v.modelRepository.s3.region | quote }}
        {{- with $v.modelRepository.s3.credentials }}
        {{- if .existingSecret }}
        - name: AWS_ACCESS_KEY_ID
          valueFrom:
            secretKeyRef:
              name: {{ .existingSecret }}
              key: {{ .accessKeyIdKey }}
        - name: AWS_SECRET_ACCESS_KEY
          valueFrom:
            secretKeyRef:
              name: {{ .existingSecret }}
              key: {{ .secretAccessKeyKey }}
        {{- if .sessionTokenKey }}
        - name: AWS_SESSION_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ .existingSecret }}
              key: {{ .sessionTokenKey }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- with $v.server.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.server.extraEnvFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        {{- if not $v.edge.enabled }}
        {{- /* With the edge, its container has the http and grpc ports (Triton's listen on loopback only). */}}
        - name: http
          containerPort: {{ $v.server.ports.http }}
          protocol: TCP
        - name: grpc
          containerPort: {{ $v.server.ports.grpc }}
          protocol: TCP
        {{- end }}
        - name: metrics
          containerPort: {{ $v.server.ports.metrics }}
          protocol: TCP
      startupProbe:
        {{- include "tritonbundle.healthProbe" (dict "path" "/v2/health/ready" "timeout" $v.probes.startup.timeoutSeconds "root" .) | trim | nindent 8 }}
        periodSeconds: {{ $v.probes.startup.periodSeconds }}
        timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
        failureThreshold: {{ div (add $v.probes.startup.budgetSeconds $v.probes.startup.periodSeconds -1) $v.probes.startup.periodSeconds }}
      {{- /* Liveness and readiness: the canary (every served model answers its smallest request; busy answers
      pass), because /v2/health/ready says ready while a Python-backend stub is dead before NGC 26.04 and
      /v2/health/live never looks at the models. probes.canary.enabled=false: Triton's health endpoints. */}}
      livenessProbe:
        {{- if $v.probes.canary.enabled }}
        exec:
          command: {{ include "tritonbundle.canaryCommand" . }}
        {{- else }}
        {{- include "tritonbundle.healthProbe" (dict "path" "/v2/health/live" "timeout" $v.probes.liveness.timeoutSeconds "root" .) | trim | nindent 8 }}
        {{- end }}
        periodSeconds: {{ $v.probes.liveness.periodSeconds }}
        timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
        failureThreshold: {{ $v.probes.liveness.failureThreshold }}
      readinessProbe:
        {{- if $v.probes.canary.enabled }}
        exec:
          command: {{ include "tritonbundle.canaryCommand" . }}
        {{- else }}
        {{- include "tritonbundle.healthProbe" (dict "path" "/v2/health/ready" "timeout" $v.probes.readiness.timeoutSeconds "root" .) | trim | nindent 8 }}
        {{- end }}
        periodSeconds: {{ $v.probes.readiness.periodSeconds }}
        timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
        failureThreshold: {{ $v.probes.readiness.failureThreshold }}
        successThreshold: {{ $v.probes.readiness.successThreshold }}
      lifecycle:
        {{- include "tritonbundle.preStop" . | nindent 8 }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- include "tritonbundle.gpuResources" (dict "resources" $v.resources "gpu" $v.gpu) | nindent 8 }}
      volumeMounts:
        - name: shm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        - name: scripts
          mountPath: /opt/tritonbundle/scripts
          readOnly: true
        {{- if eq $source "pvc" }}
        - name: model-cache
          mountPath: {{ $v.modelRepository.pvc.mountPath }}
          readOnly: true
        {{- end }}
        {{- if $engineBuild }}
        - name: run
          mountPath: {{ include "tritonbundle.runDir" . }}
          readOnly: true
        {{- end }}
        {{- if $v.pythonPackages.enabled }}
        - name: python-packages
          mountPath: {{ $v.pythonPackages.mountPath }}
          readOnly: true
        {{- end }}
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    {{- if $v.edge.enabled }}
    {{- /* The edge (files/edge-nginx.conf): nginx in front of Triton's HTTP and gRPC ports, bounding requests and
    connections (edge.limits). Its stream layer listens on 8080/8081 and relays to its HTTP layer on 127.0.0.1:18080
    and :18081 in the pod (edge-configmap.yaml refuses Triton ports there). The command replaces the image's entry
    point scripts (they would edit /etc/nginx, read-only here). */}}
    - name: edge
      image: {{ include "tritonbundle.edgeImage" . }}
      imagePullPolicy: {{ $v.edge.image.pullPolicy }}
      command: ["nginx", "-c", "/etc/nginx/tritonbundle/nginx.conf", "-e", "stderr", "-g", "daemon off;"]
      ports:
        - name: http
          containerPort: {{ include "tritonbundle.edgeHttpPort" . }}
          protocol: TCP
        - name: grpc
          containerPort: {{ include "tritonbundle.edgeGrpcPort" . }}
          protocol: TCP
      {{- /* nginx itself: listening. Whether Triton answers is the tritonserver container's probes' business. */}}
      livenessProbe:
        tcpSocket:
          port: http
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        tcpSocket:
          port: http
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 3
      {{- /* Keeps taking requests while the endpoints are updated, like Triton; the image's stop signal (SIGQUIT)
      then lets in-flight requests finish. */}}
      lifecycle:
        {{- include "tritonbundle.preStop" . | nindent 8 }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- toYaml $v.edge.resources | nindent 8 }}
      volumeMounts:
        - name: edge-config
          mountPath: /etc/nginx/tritonbundle
          readOnly: true
        - name: edge-tmp
          mountPath: /tmp
    {{- end }}
    {{- if $v.gateway.enabled }}
    {{- if not $v.edge.enabled }}
    {{- fail "gateway.enabled needs edge.enabled: the edge sends /v1/ to the gateway" }}
    {{- end }}
    {{- /* The OpenAI API (docs/openai.md, docs/tenants.md): on loopback, reached through the edge's /v1/; Triton's
    gRPC port in the same pod. */}}
    - name: gateway
      image: {{ include "tritonbundle.gatewayImage" . }}
      imagePullPolicy: {{ $v.gateway.image.pullPolicy }}
      command:
        - python3
        - -c
        - {{ include "tritonbundle.gatewayWait" . | quote }}
        - {{ printf "http://127.0.0.1:%d/v2/health/ready" (int $v.server.ports.http) | quote }}
        - {{ $v.probes.startup.budgetSeconds | quote }}
        - tritonbundle
        - gateway
        - --url
        - {{ printf "127.0.0.1:%d" (int $v.server.ports.grpc) | quote }}
        - --host
        - 127.0.0.1
        - --port
        - {{ $v.gateway.port | quote }}
        {{- range $v.gateway.models }}
        - --model
        - {{ . | quote }}
        {{- end }}
        - --usage-log
        - /var/lib/tritonbundle/usage/usage.jsonl
        - --metrics-port
        - {{ $v.gateway.metricsPort | quote }}
        - --metrics-host
        - 0.0.0.0
      {{- if $v.gateway.tenants.existingSecret }}
      env:
        - name: TRITONBUNDLE_TENANTS
          value: /etc/tritonbundle/tenants/tenants.yaml
      {{- end }}
      ports:
        - name: gateway-metrics
          containerPort: {{ $v.gateway.metricsPort }}
          protocol: TCP
      readinessProbe:
        exec:
          command: ["python3", "-c", {{ printf "import urllib.request as u; u.urlopen('http://127.0.0.1:%d/health', timeout=3)" (int $v.gateway.port) | quote }}]
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 3
      {{- /* Its metrics port opens once Triton is ready and the models checked: liveness waits for it as
      long as Triton's own startup may take, plus the gateway's 30 s check. */}}
      startupProbe:
        tcpSocket:
          port: gateway-metrics
        periodSeconds: 10
        failureThreshold: {{ div (add $v.probes.startup.budgetSeconds 60 9) 10 }}
      livenessProbe:
        tcpSocket:
          port: gateway-metrics
        periodSeconds: 10
      lifecycle:
        {{- include "tritonbundle.preStop" . | nindent 8 }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- toYaml $v.gateway.resources | nindent 8 }}
      volumeMounts:
        - name: gateway-usage
          mountPath: /var/lib/tritonbundle/usage
        - name: edge-tmp
          mountPath: /tmp
          subPath: gateway
        {{- if $v.gateway.tenants.existingSecret }}
        - name: gateway-tenants
          mountPath: /etc/tritonbundle/tenants
          readOnly: true
        {{- end }}
    {{- end }}
    {{- with $v.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumes:
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.shm.sizeLimit }}
    - name: tmp
      emptyDir:
        {{- /* Triton copies an S3 repository into a temporary folder under /tmp. */}}
        sizeLimit: {{ eq $source "s3" | ternary $v.modelRepository.s3.localCacheSizeLimit $v.tmp.sizeLimit }}
    - name: scripts
      configMap:
        name: {{ include "tritonbundle.fullname" . }}-scripts
        defaultMode: 0555
    {{- if $v.edge.enabled }}
    - name: edge-config
      configMap:
        name: {{ include "tritonbundle.fullname" . }}-edge
    - name: edge-tmp
      emptyDir:
        sizeLimit: {{ $v.edge.tmpSizeLimit }}
    {{- end }}
    {{- if $v.gateway.enabled }}
    - name: gateway-usage
      emptyDir:
        sizeLimit: 1Gi
    {{- if $v.gateway.tenants.existingSecret }}
    - name: gateway-tenants
      secret:
        secretName: {{ $v.gateway.tenants.existingSecret }}
        items:
          - key: tenants.yaml
            path: tenants.yaml
    {{- end }}
    {{- end }}
    {{- if $engineBuild }}
    - name: run
      emptyDir:
        sizeLimit: 1Mi
    {{- end }}
    {{- if $v.pythonPackages.enabled }}
    - name: python-packages
      emptyDir:
        sizeLimit: 512Mi
    {{- end }}
    {{- if and (eq $source "pvc") (or $v.modelRepository.pvc.existingClaim (not (include "tritonbundle.isStatefulSet" .))) }}
    - name: model-cache
      persistentVolumeClaim:
        claimName: {{ include "tritonbundle.pvcName" . }}
    {{- end }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- range . }}
    {{- $c := deepCopy . }}
    {{- if not (hasKey $c "labelSelector") }}
    {{- $_ := set $c "labelSelector" (include "tritonbundle.serverPodSelector" $ | fromYaml) }}
    {{- end }}
    - {{ toYaml $c | indent 6 | trim }}
    {{- end }}
  {{- end }}
{{- end }}
