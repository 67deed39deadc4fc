{{/* Chart name, overridable. */}}
{{- define "foldgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name prefix; 63 chars minus room for "-redis" / "-vllm" suffixes. */}}
{{- define "foldgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Common labels; call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "foldgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "foldgate.selectorLabels" . }}
{{- end }}

{{/* Selector labels; call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "foldgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "foldgate.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "foldgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* True (non-empty) when the gateway uses a Redis outside this release. */}}
{{- define "foldgate.redis.external" -}}
{{- if or .Values.redis.external.url .Values.redis.external.existingSecret }}true{{ end }}
{{- end }}

{{/* True (non-empty) when the in-release Redis requires a password. */}}
{{- define "foldgate.redis.auth" -}}
{{- if and .Values.redis.auth.enabled (not (include "foldgate.redis.external" .)) }}true{{ end }}
{{- end }}

{{/* Name of the Secret with the in-release Redis password. */}}
{{- define "foldgate.redis.authSecret" -}}
{{- default (printf "%s-redis" (include "foldgate.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* host:port of the in-release Redis. */}}
{{- define "foldgate.redis.address" -}}
{{- printf "%s-redis:%v" (include "foldgate.fullname" .) .Values.redis.port }}
{{- end }}

{{/*
store_url for the TOML config / Serve args; empty when it comes from the environment instead
(a URL in an external Secret, or the in-release Redis with its password).
*/}}
{{- define "foldgate.storeUrl" -}}
{{- if or .Values.redis.external.existingSecret (include "foldgate.redis.auth" .) }}
{{- else if .Values.redis.external.url }}
{{- if not (hasPrefix "redis://" .Values.redis.external.url) }}
{{- if not (hasPrefix "rediss://" .Values.redis.external.url) }}
{{- fail (printf "redis.external.url must start with redis:// or rediss://, got %q" .Values.redis.external.url) }}
{{- end }}
{{- end }}
{{- .Values.redis.external.url }}
{{- else }}
{{- printf "redis://%s/0" (include "foldgate.redis.address" .) }}
{{- end }}
{{- end }}

{{/*
Env entries that give the gateway its store URL (and API keys) from Secrets. Kubernetes
expands $(STORE_PASSWORD) inside the pod, so the password is in no ConfigMap, arg or value.
Not REDIS_PASSWORD: KubeRay refuses that name on a head pod with GCS fault tolerance.
*/}}
{{- define "foldgate.gatewaySecretEnv" -}}
{{- $apiKeysSecret := include "foldgate.apiKeysSecret" . }}
{{- with .Values.redis.external.existingSecret }}
- name: FOLDGATE_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.redis.external.existingSecretKey }}
{{- end }}
{{- if include "foldgate.redis.auth" . }}
- name: STORE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "foldgate.redis.authSecret" . }}
      key: {{ .Values.redis.auth.existingSecretKey }}
- name: FOLDGATE_STORE_URL
  value: {{ printf "redis://:$(STORE_PASSWORD)@%s/0" (include "foldgate.redis.address" .) | quote }}
{{- end }}
{{- if $apiKeysSecret }}
- name: FOLDGATE_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ $apiKeysSecret }}
      key: {{ .Values.apiKeys.existingSecretKey }}
- name: FOLDGATE_CACHE_SALT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ $apiKeysSecret }}
      key: {{ .Values.apiKeys.cacheSaltSecretKey }}
      optional: true
{{- end }}
{{- end }}

{{/* Image of the RayService's head and workers: the gateway image unless overridden. */}}
{{- define "foldgate.rayImage" -}}
{{- $ray := .Values.gateway.rayService.image }}
{{- printf "%s:%s" (default .Values.image.repository $ray.repository) (default (default .Chart.AppVersion .Values.image.tag) $ray.tag) }}
{{- end }}

{{/* "host:port" of the vLLM headless Service: its A records are the ready replicas. */}}
{{- define "foldgate.replicaDns" -}}
{{- printf "%s-vllm.%s.svc.%s:%v" (include "foldgate.fullname" .) .Release.Namespace .Values.clusterDomain .Values.vllm.port }}
{{- end }}

{{/* Name of the Secret with the API key map, empty when there is none. */}}
{{- define "foldgate.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret }}
{{- .Values.apiKeys.existingSecret }}
{{- else if .Values.apiKeys.keys }}
{{- printf "%s-api-keys" (include "foldgate.fullname" .) }}
{{- end }}
{{- end }}

{{/*
One TOML value. Helm reads YAML numbers as float64, and Go prints large ones in exponent
form (3.3554432e+07), which TOML would read as a float: whole numbers print as integers.
*/}}
{{- define "foldgate.tomlValue" -}}
{{- $v := .value }}
{{- if kindIs "string" $v }}
{{- toJson $v }}
{{- else if kindIs "bool" $v }}
{{- ternary "true" "false" $v }}
{{- else if kindIs "float64" $v }}
{{- if eq $v (floor $v) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}
{{- $v }}
{{- else if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}
{{- $items = append $items (include "foldgate.tomlValue" (dict "key" $.key "value" .)) }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else if kindIs "map" $v }}
{{- $items := list }}
{{- range $k, $item := $v }}
{{- $items = append $items (printf "%s = %s" (toJson $k) (include "foldgate.tomlValue" (dict "key" $.key "value" $item))) }}
{{- end }}
{{- printf "{%s}" (join ", " $items) }}
{{- else }}
{{- fail (printf "config.%s: unsupported value %v (use a string, number, bool, list or map)" .key $v) }}
{{- end }}
{{- end }}

{{/* Fails on values.config keys that the chart owns or that contradict vllm.enabled. */}}
{{- define "foldgate.checkConfig" -}}
{{- range $key := list "store_url" "api_keys" "cache_salt_secret" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s is set by the chart: use %s instead" $key (ternary "redis.external" "apiKeys" (eq $key "store_url"))) }}
{{- end }}
{{- end }}
{{- if .Values.vllm.enabled }}
{{- range $key := list "replicas" "replica_dns" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s conflicts with vllm.enabled=true (the chart points the gateway at its vLLM replicas); set vllm.enabled=false to use your own" $key) }}
{{- end }}
{{- end }}
{{- else if not (or .Values.config.replicas .Values.config.replica_dns) }}
{{- fail "vllm.enabled=false needs config.replicas (list of http://host:port) or config.replica_dns (host:port)" }}
{{- end }}
{{- end }}

{{/* The gateway's TOML config: values.config plus what the chart wires (store, replicas). */}}
{{- define "foldgate.configToml" -}}
{{- include "foldgate.checkConfig" . -}}
# Rendered by the foldgate Helm chart from values.config; keys are GatewayConfig fields.
{{- with include "foldgate.storeUrl" . }}
store_url = {{ toJson . }}
{{- end }}
{{- if .Values.vllm.enabled }}
replica_dns = {{ include "foldgate.replicaDns" . | toJson }}
{{- end }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ include "foldgate.tomlValue" (dict "key" $key "value" $value) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The Ray Serve config of gateway.mode=rayservice: deploy/serve.yaml's application with the
chart's values as the builder's args (GatewayConfig fields + num_replicas +
max_ongoing_requests), exactly what `foldgate serve --ray` would build from the same config.
Secrets never enter it: the store URL with a password and the API keys reach the Serve
replicas as FOLDGATE_* env of the Ray containers.
*/}}
{{- define "foldgate.serveConfig" -}}
{{- include "foldgate.checkConfig" . }}
{{- $serve := .Values.gateway.rayService.serve }}
{{- $args := dict }}
{{- with include "foldgate.storeUrl" . }}
{{- $_ := set $args "store_url" . }}
{{- end }}
{{- if .Values.vllm.enabled }}
{{- $_ := set $args "replica_dns" (include "foldgate.replicaDns" .) }}
{{- end }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $args $key $value }}
{{- end }}
{{- end }}
{{- $_ := set $args "num_replicas" (int $serve.numReplicas) }}
{{- $_ := set $args "max_ongoing_requests" (int $serve.maxOngoingRequests) }}
{{- $app := dict "name" "foldgate" "route_prefix" "/" "import_path" "gateway.serve_ray:build_app" "args" $args }}
{{- toYaml (dict "http_options" (dict "host" "0.0.0.0" "port" (int $serve.port)) "applications" (list $app)) }}
{{- end }}

{{/*
Pod template of a Ray head or worker group; call with (dict "ctx" $ "group" <values> "head"
bool). Serve replicas run here, so these pods carry the gateway's labels: the gateway
Service, the NetworkPolicies and the PodDisruptionBudget select them as gateway pods.
Probes are plain HTTP on the dashboard agent's unified /api/healthz (raylet, and GCS on the
head; Ray >= 2.53) and, for worker readiness, Serve's proxy: KubeRay then injects none (its
exec probes for older Ray need wget, which the image lacks).
*/}}
{{- define "foldgate.rayPodTemplate" -}}
{{- $ := .ctx }}
{{- $rs := $.Values.gateway.rayService -}}
metadata:
  labels:
    {{- include "foldgate.labels" (dict "ctx" $ "component" "gateway") | nindent 4 }}
  {{- with $.Values.gateway.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: {{ ternary "ray-head" "ray-worker" .head }}
      image: {{ include "foldgate.rayImage" $ | quote }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      env:
        # The embedded store's home; unused with Redis, but keeps writes in the pod's /tmp.
        - name: FOLDGATE_HOME
          value: /tmp/foldgate
        {{- if $rs.fastPath }}
        # Read by Serve when its processes start (deploy/serve.yaml).
        - name: RAY_SERVE_ENABLE_HA_PROXY
          value: "1"
        - name: RAY_SERVE_THROUGHPUT_OPTIMIZED
          value: "1"
        {{- end }}
        {{- with include "foldgate.gatewaySecretEnv" $ | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $.Values.gateway.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        {{- if .head }}
        - name: gcs-server
          containerPort: 6379
          protocol: TCP
        - name: dashboard
          containerPort: 8265
          protocol: TCP
        - name: client
          containerPort: 10001
          protocol: TCP
        {{- end }}
        - name: serve
          containerPort: {{ $rs.serve.port }}
          protocol: TCP
        - name: dashboard-agent
          containerPort: 52365
          protocol: TCP
      # The head is ready with its raylet and GCS (KubeRay deploys the Serve config only
      # then); a worker once its Serve proxy answers.
      readinessProbe:
        httpGet:
          {{- if .head }}
          path: /api/healthz
          port: dashboard-agent
          {{- else }}
          path: /-/healthz
          port: serve
          {{- end }}
        initialDelaySeconds: 10
        periodSeconds: 5
        timeoutSeconds: 2
        failureThreshold: 6
      livenessProbe:
        httpGet:
          path: /api/healthz
          port: dashboard-agent
        initialDelaySeconds: 30
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: [ALL]
      resources:
        {{- toYaml .group.resources | nindent 8 }}
  {{- with .group.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
