{{/* Names: <fullname>-extender, <fullname>-device-plugin, <fullname>-scheduler. */}}
{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "gpushare.selector" (list . "extender") */}}
{{- define "gpushare.selector" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ $ctx.Chart.Name }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gpushare.extender.name" -}}{{ include "gpushare.fullname" . }}-extender{{- end -}}
{{- define "gpushare.devicePlugin.name" -}}{{ include "gpushare.fullname" . }}-device-plugin{{- end -}}
{{- define "gpushare.scheduler.name" -}}{{ include "gpushare.fullname" . }}-scheduler{{- end -}}

{{- define "gpushare.extender.scheme" -}}
{{- if .Values.extender.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* The extender's URL for kube-scheduler (values.yaml, scheduler.urlPrefix). */}}
{{- define "gpushare.extender.urlPrefix" -}}
{{- if .Values.scheduler.urlPrefix -}}
{{- .Values.scheduler.urlPrefix -}}
{{- else if .Values.extender.service.clusterIP -}}
{{- printf "%s://%s:%d%s" (include "gpushare.extender.scheme" .) .Values.extender.service.clusterIP (int .Values.extender.port) .Values.extender.prefix -}}
{{- else -}}
{{- include "gpushare.extender.serviceURL" . -}}
{{- end -}}
{{- end -}}

{{/* The extender's URL through the Service's DNS name (in-cluster schedulers). */}}
{{- define "gpushare.extender.serviceURL" -}}
{{- printf "%s://%s.%s.svc:%d%s" (include "gpushare.extender.scheme" .) (include "gpushare.extender.name" .) .Release.Namespace (int .Values.extender.port) .Values.extender.prefix -}}
{{- end -}}

{{/*
The kube-scheduler `extenders` list (kubescheduler.config.k8s.io/v1 Extender), as YAML, for
  include "gpushare.scheduler.extenders" (list . urlPrefix)
It matches gpushare.testing.controlplane.gpushare_extender: tests/cluster/test_deploy_chart.py.
*/}}
{{- define "gpushare.scheduler.extenders" -}}
{{- $ctx := index . 0 -}}
{{- $entry := dict
  "urlPrefix" (index . 1)
  "filterVerb" "filter"
  "prioritizeVerb" "prioritize"
  "bindVerb" "bind"
  "weight" (int $ctx.Values.scheduler.weight)
  "enableHTTPS" $ctx.Values.extender.tls.enabled
  "nodeCacheCapable" true
  "httpTimeout" $ctx.Values.scheduler.httpTimeout
  "ignorable" false
  "managedResources" (list (dict "name" "aliyun.com/gpu-mem" "ignoredByScheduler" false))
-}}
{{- if $ctx.Values.scheduler.tlsConfig -}}
{{- $_ := set $entry "tlsConfig" $ctx.Values.scheduler.tlsConfig -}}
{{- end -}}
{{- toYaml (list $entry) -}}
{{- end -}}

{{- define "gpushare.scheduler.imageTag" -}}
{{- .Values.scheduler.second.image.tag | default (regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "") -}}
{{- end -}}
