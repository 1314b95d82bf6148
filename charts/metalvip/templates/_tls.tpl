{{/*
Every use of the mutual TLS between the CCM and the agents is in this file, so a change of how
identities are provisioned (e.g. per-node certificates issued by the CCM) changes one place.
*/}}

{{/* The TLS files in the CCM's cloud-config. */}}
{{- define "metalvip.tls.ccm.cloudConfig" -}}
caFile: /etc/metalvip/tls/ca.crt
certFile: /etc/metalvip/tls/tls.crt
keyFile: /etc/metalvip/tls/tls.key
{{- end -}}

{{- define "metalvip.tls.ccm.volumeMount" -}}
- {name: tls, mountPath: /etc/metalvip/tls, readOnly: true}
{{- end -}}

{{- define "metalvip.tls.ccm.volume" -}}
- name: tls
  secret: {secretName: {{ .Values.tls.ccmSecretName }}}
{{- end -}}

{{/* Each agent uses its node's certificate from the shared Secret. */}}
{{- define "metalvip.tls.agent.args" -}}
- --tls-ca=/etc/metalvip/tls/ca.crt
- --tls-cert=/etc/metalvip/tls/$(NODE_NAME).crt
- --tls-key=/etc/metalvip/tls/$(NODE_NAME).key
{{- end -}}

{{- define "metalvip.tls.agent.volumeMount" -}}
- {name: tls, mountPath: /etc/metalvip/tls, readOnly: true}
{{- end -}}

{{- define "metalvip.tls.agent.volume" -}}
- name: tls
  secret: {secretName: {{ .Values.tls.agentSecretName }}, defaultMode: 0400}
{{- end -}}
