{{- define "narad.name" -}}{{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "narad.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- define "narad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "narad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "narad.labels" -}}
{{ include "narad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
{{- define "narad.serviceAccountName" -}}
{{- default (include "narad.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}
{{- define "narad.securitySecret" -}}
{{- default (printf "%s-security" (include "narad.fullname" .)) .Values.security.existingSecret -}}
{{- end -}}
{{/* The port the startup and liveness probes use: the metrics listener when there is one. */}}
{{- define "narad.healthPort" -}}
{{- if .Values.metrics.enabled }}metrics{{ else }}api{{ end -}}
{{- end -}}
{{/* Whether narad.config is non-empty (then the ConfigMap exists and --config is passed). */}}
{{- define "narad.hasConfig" -}}
{{- if .Values.narad.config }}true{{ end -}}
{{- end -}}
{{/* A list of integers as "a,b,c" (YAML numbers arrive as floats, which print in exponent form). */}}
{{- define "narad.intList" -}}
{{- $out := list -}}
{{- range . }}{{ $out = append $out (int64 . | toString) }}{{ end -}}
{{- join "," $out -}}
{{- end -}}
