{{/*
Every use of the mutual TLS between the CCM and the agents is in this file. tls.mode enroll
(the default): the CCM issues each agent its certificate for a projected ServiceAccount token
(docs/agent-tls.md); files: the Secrets `metalvipctl certs --manifests` prints.
*/}}

{{/* The TLS settings in the CCM's cloud-config. */}}
{{- define "metalvip.tls.ccm.cloudConfig" -}}
{{- if eq .Values.tls.mode "enroll" -}}
enroll:
  enabled: true
  namespace: {{ .Release.Namespace }}
  serviceAccount: {{ include "metalvip.agent.serviceAccountName" . }}
{{- else -}}
caFile: /etc/metalvip/tls/ca.crt
certFile: /etc/metalvip/tls/tls.crt
keyFile: /etc/metalvip/tls/tls.key
{{- end -}}
{{- end -}}

{{/* The CCM reads the agents' CA from its Secret through the API: nothing to mount. */}}
{{- define "metalvip.tls.ccm.volumeMount" -}}
{{- if eq .Values.tls.mode "files" -}}
- {name: tls, mountPath: /etc/metalvip/tls, readOnly: true}
{{- end -}}
{{- end -}}

{{- define "metalvip.tls.ccm.volume" -}}
{{- if eq .Values.tls.mode "files" -}}
- name: tls
  secret: {secretName: {{ .Values.tls.ccmSecretName }}}
{{- end -}}
{{- end -}}

{{/* The CCM's access to the agents' CA (the Role in the release's namespace). */}}
{{- define "metalvip.tls.ccm.rules" -}}
{{- if eq .Values.tls.mode "enroll" -}}
- apiGroups: [""]
  resources: [secrets, configmaps]
  resourceNames: [metalvip-ca]
  verbs: [get, update]
- apiGroups: [""]
  resources: [secrets, configmaps]
  verbs: [create]
{{- end -}}
{{- end -}}

{{- define "metalvip.tls.agent.args" -}}
{{- if eq .Values.tls.mode "enroll" -}}
- --tls-mode=enroll
- --tls-ca=/etc/metalvip/ca/ca.crt
- --token-file=/var/run/secrets/metalvip/token
{{- else -}}
- --tls-ca=/etc/metalvip/tls/ca.crt
- --tls-cert=/etc/metalvip/tls/$(NODE_NAME).crt
- --tls-key=/etc/metalvip/tls/$(NODE_NAME).key
{{- end -}}
{{- end -}}

{{- define "metalvip.tls.agent.volumeMount" -}}
{{- if eq .Values.tls.mode "enroll" -}}
- {name: ca, mountPath: /etc/metalvip/ca, readOnly: true}
- {name: token, mountPath: /var/run/secrets/metalvip, readOnly: true}
{{- else -}}
- {name: tls, mountPath: /etc/metalvip/tls, readOnly: true}
{{- end -}}
{{- end -}}

{{- define "metalvip.tls.agent.volume" -}}
{{- if eq .Values.tls.mode "enroll" -}}
- name: ca
  configMap: {name: metalvip-ca}
- name: token
  projected:
    sources:
    - serviceAccountToken: {audience: metalvip-agent, expirationSeconds: 600, path: token}
{{- else -}}
- name: tls
  secret: {secretName: {{ .Values.tls.agentSecretName }}, defaultMode: 0400}
{{- end -}}
{{- end -}}
