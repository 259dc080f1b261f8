{{/* The name of every object of the chart. */}}
{{- define "ebpf-proxy.name" -}}
{{- default "ebpf-proxy" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that select the agent's pods: those of deploy/, which a
DaemonSet keeps for good (its selector cannot change). */}}
{{- define "ebpf-proxy.selector" -}}
k8s-app: {{ include "ebpf-proxy.name" . }}
{{- end -}}

{{/* Helm's labels of every object. */}}
{{- define "ebpf-proxy.labels" -}}
app.kubernetes.io/name: {{ include "ebpf-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The ConfigMap the agent reads kube-proxy's configuration from. */}}
{{- define "ebpf-proxy.configMap" -}}
{{- if .Values.kubeProxyConfig.existingConfigMap -}}
{{- .Values.kubeProxyConfig.existingConfigMap -}}
{{- else -}}
{{- printf "%s-config" (include "ebpf-proxy.name" .) -}}
{{- end -}}
{{- end -}}
