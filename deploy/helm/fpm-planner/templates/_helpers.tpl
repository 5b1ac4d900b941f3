{{- define "fpm-planner.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fpm-planner.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fpm-planner.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fpm-planner.serviceAccountName" -}}
{{- default (include "fpm-planner.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The shard StatefulSet's name (room left for "-<ordinal>" and the controller-revision-hash label). */}}
{{- define "fpm-planner.shardName" -}}
{{- printf "%s-shard" (include "fpm-planner.fullname" . | trunc 46 | trimSuffix "-") -}}
{{- end -}}

{{- define "fpm-planner.shardSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-shard
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Values that cannot work fail the render with a message naming them. */}}
{{- define "fpm-planner.validateIngest" -}}
{{- if not (has .Values.ingest.transport (list "zmq" "nats")) -}}
{{- fail (printf "ingest.transport must be zmq or nats, got %q" .Values.ingest.transport) -}}
{{- end -}}
{{- if and (eq .Values.ingest.transport "nats") (not .Values.ingest.nats.servers) -}}
{{- fail "ingest.nats.servers: give the NATS server URLs with ingest.transport: nats (this chart does not install NATS)" -}}
{{- end -}}
{{- if and (gt (int .Values.shards.replicas) 0) (ne .Values.ingest.transport "nats") -}}
{{- fail "shards.replicas > 0 needs ingest.transport: nats (shards subscribe on NATS)" -}}
{{- end -}}
{{- end -}}
