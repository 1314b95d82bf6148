{{/*
Names and labels. The objects keep fixed names (they are cluster singletons: one CCM, one
agent per node) and the labels manifests/ carries, so the chart and kustomize render the same.
*/}}

{{- define "metalvip.ccm.name" -}}metalvip-cloud-controller-manager{{- end -}}
{{- define "metalvip.agent.name" -}}metalvip-agent{{- end -}}

{{- define "metalvip.ccm.labels" -}}
app.kubernetes.io/name: {{ include "metalvip.ccm.name" . }}
app.kubernetes.io/part-of: metalvip
{{- end -}}

{{- define "metalvip.agent.labels" -}}
app.kubernetes.io/name: {{ include "metalvip.agent.name" . }}
app.kubernetes.io/part-of: metalvip
{{- end -}}

{{/*
metalvip.image: registry/repository@digest, else registry/repository:tag (tag defaults to
the chart's appVersion). Called with (list $ .Values.ccm.image).
*/}}
{{- define "metalvip.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $name := printf "%s/%s" (trimSuffix "/" $root.Values.image.registry) $image.repository -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "metalvip.imagePullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "metalvip.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
