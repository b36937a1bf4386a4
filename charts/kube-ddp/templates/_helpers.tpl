{{/* Names and labels. */}}
{{- define "kube-ddp.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kube-ddp.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kube-ddp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-ddp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kube-ddp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kube-ddp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: kube-ddp
{{- end -}}

{{- define "kube-ddp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kube-ddp.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when image.digest is set (what was verified is what runs), else :tag. */}}
{{- define "kube-ddp.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kube-ddp.leaseName" -}}
{{- include "kube-ddp.fullname" . -}}
{{- end -}}

{{/* Checks across values that values.schema.json cannot express. */}}
{{- define "kube-ddp.validate" -}}
{{- $le := .Values.leaderElection -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $le.enabled) -}}
{{- fail (printf "replicaCount=%v needs leaderElection.enabled=true: without the Lease every replica would act on every job" .Values.replicaCount) -}}
{{- end -}}
{{- if $le.enabled -}}
{{- if not (and (lt ($le.retryPeriod | float64) ($le.renewDeadline | float64)) (lt ($le.renewDeadline | float64) ($le.leaseDuration | float64))) -}}
{{- fail (printf "leaderElection: need retryPeriod < renewDeadline < leaseDuration, got %v < %v < %v" $le.retryPeriod $le.renewDeadline $le.leaseDuration) -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.operator.healthPort) (int .Values.metrics.port) -}}
{{- fail (printf "operator.healthPort and metrics.port must differ (both are %v)" .Values.metrics.port) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes through that Service" -}}
{{- end -}}
{{- end -}}
