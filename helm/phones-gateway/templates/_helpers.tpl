{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "phones-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name alone when it already holds
the chart name. 57 characters leave room for the "-admin" suffix.
*/}}
{{- define "phones-gateway.fullname" -}}
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

{{/*
chart label value: name-version.
*/}}
{{- define "phones-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "phones-gateway.labels" -}}
helm.sh/chart: {{ include "phones-gateway.chart" . }}
{{ include "phones-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: phones-gateway
{{- end }}

{{/*
Labels that select the pods (immutable in a Deployment: never add to these).
*/}}
{{- define "phones-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "phones-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "phones-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "phones-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference.
*/}}
{{- define "phones-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The port of a "host:port" listen address, e.g. "0.0.0.0:8080" -> 8080.
Usage: include "phones-gateway.addrPort" (list "server.public_addr" $addr)
*/}}
{{- define "phones-gateway.addrPort" -}}
{{- $key := index . 0 }}
{{- $addr := toString (index . 1) }}
{{- $port := regexFind "[0-9]+$" $addr }}
{{- if or (not $port) (not (regexMatch ":[0-9]+$" $addr)) }}
{{- fail (printf "config.%s must be host:port, got %q" $key $addr) }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The container's public port, from config.server.public_addr. */}}
{{- define "phones-gateway.publicPort" -}}
{{- include "phones-gateway.addrPort" (list "server.public_addr" (dig "server" "public_addr" "0.0.0.0:8080" .Values.config)) }}
{{- end }}

{{/* The container's admin port, from config.server.admin_addr. */}}
{{- define "phones-gateway.adminPort" -}}
{{- include "phones-gateway.addrPort" (list "server.admin_addr" (dig "server" "admin_addr" "0.0.0.0:8081" .Values.config)) }}
{{- end }}

{{/* The container's probe port, from config.server.probe_addr; empty when it is unset or "". */}}
{{- define "phones-gateway.probePort" -}}
{{- with (dig "server" "probe_addr" "" .Values.config) }}
{{- include "phones-gateway.addrPort" (list "server.probe_addr" .) }}
{{- end }}
{{- end }}

{{/* The named port the kubelet's probes use: "probe" when config.server.probe_addr is set, else "admin". */}}
{{- define "phones-gateway.probePortName" -}}
{{- if include "phones-gateway.probePort" . }}probe{{ else }}admin{{ end }}
{{- end }}

{{/*
Whole-number floats to int64, recursively, in place (maps and lists). Helm
reads every YAML number as float64, and toToml would then write 300 as 300.0,
which the service refuses for an integer key.
Usage: include "phones-gateway.intify" $map  (renders nothing)
*/}}
{{- define "phones-gateway.intify" -}}
{{- $m := . }}
{{- range $k, $v := $m }}
{{- if kindIs "map" $v }}
{{- include "phones-gateway.intify" $v }}
{{- else if kindIs "slice" $v }}
{{- $out := list }}
{{- range $e := $v }}
{{- if and (kindIs "float64" $e) (eq $e (floor $e)) }}
{{- $out = append $out (int64 $e) }}
{{- else }}
{{- if kindIs "map" $e }}{{ include "phones-gateway.intify" $e }}{{ end }}
{{- $out = append $out $e }}
{{- end }}
{{- end }}
{{- $_ := set $m $k $out }}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) }}
{{- $_ := set $m $k (int64 $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The rendered config.toml: .Values.config with whole numbers as integers.
*/}}
{{- define "phones-gateway.configToml" -}}
{{- $config := deepCopy .Values.config }}
{{- include "phones-gateway.intify" $config }}
{{- if .Values.migrations.job.enabled }}
{{- /* The hook Job migrates before the pods roll: the pods need not. */}}
{{- $db := get $config "database" | default dict }}
{{- $_ := set $db "migrate_on_start" false }}
{{- $_ := set $config "database" $db }}
{{- end }}
{{- $serverKeys := get $config "server" | default dict }}
{{- if and (hasKey $serverKeys "probe_addr") (not (get $serverKeys "probe_addr")) }}
{{- $_ := unset $serverKeys "probe_addr" }}
{{- end }}
{{- $l := .Values.locality }}
{{- if or $l.haproxy.enabled $l.envoy.enabled $l.istio.enabled }}
{{- /* These balancers forward bodies as they arrive, so every client is the
balancer's address: each client's share of the body buffer is then the whole
public share (docs/operations.md, "Request bodies in memory"), unless set. */}}
{{- $server := get $config "server" | default dict }}
{{- if not (hasKey $server "max_body_buffer_per_client_bytes") }}
{{- $buffer := int64 (get $server "max_body_buffer_bytes" | default 67108864) }}
{{- $_ := set $server "max_body_buffer_per_client_bytes" (sub $buffer (div $buffer 4)) }}
{{- $_ := set $config "server" $server }}
{{- end }}
{{- end }}
{{- if .Values.adminTokens }}
{{- /* Each named token as a file from its Secret (see phones-gateway.tokenDir). */}}
{{- $admin := get $config "admin" | default dict }}
{{- $tokens := list }}
{{- range .Values.adminTokens }}
{{- $file := printf "%s/%s" (include "phones-gateway.tokenDir" .name) (.secretKey | default "token") }}
{{- $tokens = append $tokens (dict "name" .name "token_file" $file "scopes" .scopes) }}
{{- end }}
{{- $_ := set $admin "tokens" $tokens }}
{{- $_ := set $config "admin" $admin }}
{{- end }}
{{- toToml $config }}
{{- end }}

{{/*
Where a named admin token's Secret is mounted (a directory, not a subPath
file: a subPath mount is never refreshed, so a rotated token would not reach
the pod).
*/}}
{{- define "phones-gateway.tokenDir" -}}
{{- printf "/var/run/secrets/phones-gateway/%s" . }}
{{- end }}

{{/*
The migration Job's name (the fullname leaves 6 characters; trunc keeps the
63 of a label value, the Job's name is its pods' job-name label).
*/}}
{{- define "phones-gateway.migrateName" -}}
{{- printf "%s-migrate" (include "phones-gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The database URLs' environment, from the Secret only (the Deployment and the
migration Job share it).
*/}}
{{- define "phones-gateway.databaseEnv" -}}
{{- if .Values.database.secretName }}
- name: PHONES_GATEWAY__DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.secretName }}
      key: {{ .Values.database.secretKey }}
{{- if .Values.database.directUrlKey }}
- name: PHONES_GATEWAY__DATABASE__DIRECT_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.secretName }}
      key: {{ .Values.database.directUrlKey }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Refuses values that would deploy something broken or leak a secret.
*/}}
{{- define "phones-gateway.validate" -}}
{{- if dig "admin" "token" "" .Values.config }}
{{- fail "config.admin.token must stay empty: put the token in a Secret and set adminToken.secretName (the ConfigMap is not secret)" }}
{{- end }}
{{- if dig "admin" "tokens" (list) .Values.config }}
{{- fail "config.admin.tokens must stay empty: list named tokens in adminTokens, each from its own Secret (the ConfigMap is not secret)" }}
{{- end }}
{{- $names := list }}
{{- range .Values.adminTokens }}
{{- if not (regexMatch "^[a-z0-9_-]{1,64}$" (toString .name)) }}
{{- fail (printf "adminTokens: name %q must be 1 to 64 of a-z 0-9 - _" (toString .name)) }}
{{- end }}
{{- if has .name $names }}
{{- fail (printf "adminTokens: name %q is listed twice" .name) }}
{{- end }}
{{- $names = append $names .name }}
{{- if not .existingSecret }}
{{- fail (printf "adminTokens %s: existingSecret must name the Secret holding its token" .name) }}
{{- end }}
{{- if not .scopes }}
{{- fail (printf "adminTokens %s: scopes must list what it may do" .name) }}
{{- end }}
{{- end }}
{{- $dbUrl := toString (dig "database" "url" "" .Values.config) }}
{{- if and $dbUrl (not (hasPrefix "sqlite:" $dbUrl)) }}
{{- fail "config.database.url must not hold a PostgreSQL URL (it would sit in the ConfigMap, password and all): put it in a Secret and set database.secretName/secretKey (and database.directUrlKey for direct_url); config.database.url takes only an sqlite: URL" }}
{{- end }}
{{- if dig "database" "direct_url" "" .Values.config }}
{{- fail "config.database.direct_url must stay empty: put PostgreSQL's own URL in the database Secret and set database.directUrlKey" }}
{{- end }}
{{- if and .Values.database.secretName $dbUrl }}
{{- fail "config.database.url is set although database.secretName is: the Secret's URL would win and the sqlite: URL be ignored; remove config.database.url, or set database.secretName: \"\" for SQLite" }}
{{- end }}
{{- if and (not .Values.database.secretName) (not $dbUrl) }}
{{- fail "database.secretName is empty and config.database.url is not set: name the Secret holding the PostgreSQL URL, or set an sqlite: config.database.url (with persistence.enabled, one replica)" }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if and (has .name (list "PHONES_GATEWAY__ADMIN__TOKEN" "PHONES_GATEWAY__DATABASE__URL" "PHONES_GATEWAY__DATABASE__DIRECT_URL")) (hasKey . "value") }}
{{- fail (printf "extraEnv %s must not have a value: it is a secret; the chart sets it from a Secret (adminToken.*, database.*)" .name) }}
{{- end }}
{{- end }}
{{- if and .Values.migrations.job.enabled (not .Values.database.secretName) }}
{{- fail "migrations.job.enabled needs PostgreSQL (database.secretName): a Job cannot reach the SQLite file of the single pod, which migrates it at start" }}
{{- end }}
{{- if .Values.persistence.enabled }}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- fail "persistence (a SQLite file) is for a single replica: set replicaCount: 1 and autoscaling.enabled: false, or use PostgreSQL (database.secretName)" }}
{{- end }}
{{- end }}
{{- $pauseMs := dig "server" "shutdown_pause_ms" 0 .Values.config | int64 }}
{{- $drainMs := dig "server" "drain_timeout_ms" 0 .Values.config | int64 }}
{{- $needS := add (int64 .Values.lifecycle.preStopSleepSeconds) (div (add $pauseMs $drainMs 999) 1000) }}
{{- if le (int64 .Values.lifecycle.terminationGracePeriodSeconds) $needS }}
{{- fail (printf "lifecycle.terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + (server.shutdown_pause_ms + server.drain_timeout_ms)/1000 = %d" (int64 .Values.lifecycle.terminationGracePeriodSeconds) $needS) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- end }}

{{/*
The query parameter the locality recipes hash (docs/locality.md), checked to be
a plain parameter name: it is written into balancer configs verbatim.
*/}}
{{- define "phones-gateway.hashParameter" -}}
{{- $p := .Values.locality.hashParameter | default "" }}
{{- if not (regexMatch "^[a-z_]+$" $p) }}
{{- fail "locality.hashParameter must be a query parameter name such as user_id or ad_id" }}
{{- end }}
{{- $p }}
{{- end }}
