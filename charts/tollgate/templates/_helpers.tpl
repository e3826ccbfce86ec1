{{/* Names. The fullname is the release name when it already contains "tollgate", so
     `helm install tollgate …` gives a Service named `tollgate` (what examples/istio expects). */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.fullname" -}}
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

{{- define "tollgate.labels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Selects tollgate's pods only. The trial Redis has another app.kubernetes.io/name, so
     tollgate's Service, PDB and spread constraints never count Redis pods. */}}
{{- define "tollgate.selector" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The `helm test` pod: a name of its own, so no Service, PDB or policy of tollgate's selects
     it; the NetworkPolicy admits it to the gRPC port. */}}
{{- define "tollgate.testSelector" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tollgate.rulesConfigMap" -}}
{{- if .Values.existingRulesConfigMap }}{{ .Values.existingRulesConfigMap }}{{ else }}{{ include "tollgate.fullname" . }}-rules{{ end }}
{{- end }}

{{- define "tollgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* One `settings` value as the string an env var carries. Helm reads numbers from values
     files as float64, and toString prints 3600000 as "3.6e+06", which tollgate would refuse
     for an integer setting: whole numbers are printed as integers. */}}
{{- define "tollgate.scalar" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . }}{{ else }}{{ toString . }}{{ end }}
{{- end }}

{{/* Trial Redis (redis.enabled). */}}
{{- define "tollgate.redis.fullname" -}}
{{- printf "%s-redis" (include "tollgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.redis.selector" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.redis.labels" -}}
{{ include "tollgate.redis.selector" . }}
app.kubernetes.io/component: trial-redis
app.kubernetes.io/part-of: {{ include "tollgate.name" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Where tollgate keeps its buckets: "secret" (storeSecret), the trial Redis's URL when
     redis.enabled and `store` is left at memory, else `store`. */}}
{{- define "tollgate.storeKind" -}}
{{- if .Values.storeSecret }}secret
{{- else if and .Values.redis.enabled (eq (toString .Values.store) "memory") }}trial-redis
{{- else if eq (toString .Values.store) "memory" }}memory
{{- else }}url
{{- end }}
{{- end }}

{{- define "tollgate.storeUrl" -}}
{{- $kind := include "tollgate.storeKind" . }}
{{- if eq $kind "trial-redis" }}
{{- printf "redis://%s:%d" (include "tollgate.redis.fullname" .) (int .Values.redis.port) }}
{{- else }}
{{- toString .Values.store }}
{{- end }}
{{- end }}

{{/* The fewest replicas that run: the HPA's floor, or replicaCount. */}}
{{- define "tollgate.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ int .Values.autoscaling.minReplicas }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/* Combinations of values that would install but not work: refused at render time, with
     what to do instead. (Types and enums are values.schema.json's job.) */}}
{{- define "tollgate.validate" -}}
{{- $kind := include "tollgate.storeKind" . }}
{{- $store := toString .Values.store }}
{{- $tls := or (hasPrefix "rediss://" $store) (hasPrefix "rediss+" $store) }}
{{- /* 1. Memory store: each replica keeps its own buckets and admits the whole limit. */}}
{{- if and (eq $kind "memory") (not .Values.allowMemoryStoreWithReplicas) }}
{{- if .Values.autoscaling.enabled }}
{{- fail "store is memory with autoscaling.enabled: each replica would keep its own buckets, so every limit would be multiplied by however many replicas the autoscaler runs. Point `store` at Redis (or set redis.enabled for a trial), or set allowMemoryStoreWithReplicas: true if per-replica limits are what you want." }}
{{- else if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "store is memory with replicaCount %d: each replica would keep its own buckets and admit %d times every limit. Point `store` at Redis, or set replicaCount 1, or set allowMemoryStoreWithReplicas: true if per-replica limits are what you want." (int .Values.replicaCount) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- /* 2. One source for the store URL. */}}
{{- if and .Values.storeSecret (ne $store "memory") }}
{{- fail "both `store` and `storeSecret` are set: give the store URL in one place (storeSecret's key `store` would win, silently)." }}
{{- end }}
{{- /* 3. Autoscaling that cannot work. */}}
{{- if .Values.autoscaling.enabled }}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%d) is more than autoscaling.maxReplicas (%d)." (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and .Values.autoscaling.targetCPUUtilizationPercentage (not (dig "requests" "cpu" "" .Values.resources)) }}
{{- fail "autoscaling.targetCPUUtilizationPercentage needs resources.requests.cpu: the HPA measures utilization against the request and does nothing without one." }}
{{- end }}
{{- if and .Values.autoscaling.targetMemoryUtilizationPercentage (not (dig "requests" "memory" "" .Values.resources)) }}
{{- fail "autoscaling.targetMemoryUtilizationPercentage needs resources.requests.memory." }}
{{- end }}
{{- if not (or .Values.autoscaling.targetCPUUtilizationPercentage .Values.autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling.enabled needs a target: targetCPUUtilizationPercentage and/or targetMemoryUtilizationPercentage." }}
{{- end }}
{{- end }}
{{- /* 4. A PDB that no eviction could ever satisfy blocks every node drain. */}}
{{- $min := int (include "tollgate.minReplicas" .) }}
{{- $pdbMin := .Values.podDisruptionBudget.minAvailable }}
{{- if and .Values.podDisruptionBudget.enabled (gt $min 1) (not (kindIs "string" $pdbMin)) (ge (int $pdbMin) $min) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) is not below the replica count (%d): no pod could ever be evicted, and node drains would hang. Lower it or add replicas." (int $pdbMin) $min) }}
{{- end }}
{{- /* 5. Redis credentials and TLS: tollgate refuses these at startup; say so at install. */}}
{{- if and (eq $kind "trial-redis") (or .Values.redisAuth.existingSecret .Values.redisAuth.username .Values.redisTls.existingSecret) }}
{{- fail "redisAuth / redisTls are set but tollgate uses the trial Redis (redis.enabled), which has neither a password nor TLS. Point `store` at your Redis, or unset them." }}
{{- end }}
{{- if and .Values.redisTls.existingSecret (eq $kind "url") (not $tls) }}
{{- fail (printf "redisTls.existingSecret is set but store %q is not a TLS URL: use rediss://, rediss+cluster:// or rediss+sentinel:// (tollgate refuses TLS files for a plain URL)." $store) }}
{{- end }}
{{- if and .Values.redisTls.existingSecret (eq $kind "memory") }}
{{- fail "redisTls.existingSecret is set but the store is memory: set `store` (rediss://…) or storeSecret." }}
{{- end }}
{{- if and .Values.redisAuth.existingSecret (eq $kind "url") (regexMatch "^[a-z+]+://[^/@]*:[^/@]*@" $store) }}
{{- fail "redisAuth.existingSecret is set but the store URL has a password too: give the credentials in one place (tollgate refuses both)." }}
{{- end }}
{{- if and .Values.redisAuth.username (eq $kind "url") (regexMatch "^[a-z+]+://[^/:@]+(:[^/@]*)?@" $store) }}
{{- fail "redisAuth.username is set but the store URL names a user too: give the credentials in one place (tollgate refuses both)." }}
{{- end }}
{{- if and .Values.redisAuth.username (not .Values.redisAuth.existingSecret) }}
{{- fail "redisAuth.username is set without redisAuth.existingSecret (the password)." }}
{{- end }}
{{- /* 6. A NetworkPolicy with nobody allowed to the gRPC port would make Envoy fail open: rate limiting silently off. */}}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.grpcFrom) }}
{{- fail "networkPolicy.enabled with an empty networkPolicy.grpcFrom: nothing could reach the gRPC port, and Envoy (failure_mode_deny: false) would stop rate limiting without a word. List where your Envoys run, e.g. grpcFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}}]; [{namespaceSelector: {}}] allows every namespace." }}
{{- end }}
{{- end }}
