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

{{/* store_url for the TOML config; empty when it comes from a Secret instead. */}}
{{- define "foldgate.storeUrl" -}}
{{- if .Values.redis.external.existingSecret }}
{{- else if .Values.redis.external.url }}
{{- if not (hasPrefix "redis://" .Values.redis.external.url) }}
{{- if not (hasPrefix "rediss://" .Values.redis.external.url) }}
{{- fail (printf "redis.external.url must start with redis:// or rediss://, got %q" .Values.redis.external.url) }}
{{- end }}
{{- end }}
{{- .Values.redis.external.url }}
{{- else }}
{{- printf "redis://%s-redis:%v/0" (include "foldgate.fullname" .) .Values.redis.port }}
{{- end }}
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
{{- else }}
{{- fail (printf "config.%s: unsupported value %v (use a string, number, bool or list)" .key $v) }}
{{- end }}
{{- end }}

{{/* The gateway's TOML config: values.config plus what the chart wires (store, replicas). */}}
{{- define "foldgate.configToml" -}}
{{- range $key := list "store_url" "api_keys" }}
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
{{- end -}}
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
