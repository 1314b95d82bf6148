{{/*
The agent's metrics endpoint (manifests/agent/daemonset.yaml says why): on the node's address,
HTTPS with every /metrics request reviewed by the API server when agent.metricsAuth is
kubernetes, plain HTTP when none.
*/}}
{{- define "metalvip.agent.metrics.args" -}}
{{- if eq (int .Values.agent.metricsPort) 7474 }}
- --metrics-address=$(NODE_IP)
{{- else }}
- --metrics-address=[$(NODE_IP)]:{{ .Values.agent.metricsPort }}
{{- end }}
- --metrics-auth={{ .Values.agent.metricsAuth }}
{{- end -}}

{{- define "metalvip.agent.metrics.scheme" -}}
{{- if eq .Values.agent.metricsAuth "kubernetes" }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}

{{/* The API token for the reviews and for reading its own Pod (agent.restartGrace): what automountServiceAccountToken would mount, for the agent's container alone. */}}
{{- define "metalvip.agent.metrics.volumeMount" -}}
{{- if or (eq .Values.agent.metricsAuth "kubernetes") (include "metalvip.agent.restartGrace" .) }}
- {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end }}
{{- end -}}

{{- define "metalvip.agent.metrics.volume" -}}
{{- if or (eq .Values.agent.metricsAuth "kubernetes") (include "metalvip.agent.restartGrace" .) }}
- name: kube-api-access
  projected:
    sources:
    - serviceAccountToken: {expirationSeconds: 3607, path: token}
    - configMap:
        name: kube-root-ca.crt
        items: [{key: ca.crt, path: ca.crt}]
    - downwardAPI:
        items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]
{{- end }}
{{- end -}}

{{/*
metalvip.metrics.monitor: what a ServiceMonitor endpoint or a PodMonitor endpoint needs to
scrape over HTTPS with the metrics reader's token (the Secret metrics-reader.yaml renders).
Called with (list $ TLSCONFIG); an empty TLSCONFIG is insecureSkipVerify (values.yaml says why),
so that one set in values replaces it rather than merging with it.
*/}}
{{- define "metalvip.metrics.endpoint" -}}
{{- $root := index . 0 -}}
scheme: https
authorization:
  type: Bearer
  credentials: {name: {{ include "metalvip.metricsReader.name" $root }}-token, key: token}
tlsConfig: {{- toYaml (index . 1 | default (dict "insecureSkipVerify" true)) | nindent 2 }}
{{- end -}}

{{- define "metalvip.metricsReader.name" -}}metalvip-metrics-reader{{- end -}}
