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
{{/* The size of the peer list: clusterPeerCount, 0 = initialClusterSize. */}}
{{- define "narad.peerCount" -}}
{{- if int .Values.clusterPeerCount }}{{ int .Values.clusterPeerCount }}{{ else }}{{ int .Values.initialClusterSize }}{{ end -}}
{{- end -}}
{{/* Whether the pods form a cluster (a peer list of more than one pod); else each is one node. */}}
{{- define "narad.clustered" -}}
{{- if gt (int (include "narad.peerCount" .)) 1 }}true{{ end -}}
{{- end -}}
{{/* The headless DNS name of a pod, from (list <context> <pod name>): the peer list's hosts and
the advertise address (CLUSTER.md §7). */}}
{{- define "narad.podHost" -}}
{{- $ctx := index . 0 -}}
{{- printf "%s.%s-headless.%s.svc.%s" (index . 1) (include "narad.fullname" $ctx) $ctx.Release.Namespace $ctx.Values.clusterDomain -}}
{{- end -}}
{{/* NARAD_CLUSTER_PEERS: id@<headless name>:<cluster port> for pods 0..peerCount-1. */}}
{{- define "narad.peers" -}}
{{- $out := list -}}
{{- range $i := until (int (include "narad.peerCount" .)) -}}
{{- $pod := printf "%s-%d" (include "narad.fullname" $) $i -}}
{{- $out = append $out (printf "%s@%s:%d" $pod (include "narad.podHost" (list $ $pod)) (int $.Values.service.ports.cluster)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
{{/* NARAD_CLUSTER_INITIAL_MEMBERS: pods 0..initialClusterSize-1. */}}
{{- define "narad.initialMembers" -}}
{{- $out := list -}}
{{- range $i := until (int .Values.initialClusterSize) -}}
{{- $out = append $out (printf "%s-%d" (include "narad.fullname" $) $i) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
{{/* The scale-in guard Job's name (a Job name becomes a pod label value: at most 63 characters). */}}
{{- define "narad.scaleInGuardName" -}}
{{- printf "%s-scalein-guard" (include "narad.fullname" . | trunc 49 | trimSuffix "-") -}}
{{- end -}}
{{/* The scale-in guard pod's labels. Never the selector labels' pair (name and instance): the
Services, the PodDisruptionBudget and the NetworkPolicy select the broker pods by them. */}}
{{- define "narad.scaleInGuardSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-scalein-guard" (include "narad.name" . | trunc 49 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scalein-guard
{{- end -}}
