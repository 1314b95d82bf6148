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

{{/* The ServiceAccounts: the chart's own by default, or one the operator names (and may make). */}}
{{- define "metalvip.ccm.serviceAccountName" -}}
{{- default (include "metalvip.ccm.name" .) .Values.ccm.serviceAccount.name -}}
{{- end -}}

{{- /* "true" when the agent has a restart grace (agent.restartGrace, not 0s): its flags, its Pod's
name and namespace, and get on the namespace's Pods. */ -}}
{{- define "metalvip.agent.restartGrace" -}}
{{- if not (has (toString .Values.agent.restartGrace) (list "" "0" "0s")) }}true{{ end -}}
{{- end -}}

{{- define "metalvip.agent.serviceAccountName" -}}
{{- default (include "metalvip.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{/*
metalvip.podLabels: a pod template's labels, the component's and its podLabels. The chart's own
are the selector's: a podLabels key that would replace one fails the render by name. Called
with (list COMPONENT-LABELS PODLABELS "ccm"|"agent").
*/}}
{{- define "metalvip.podLabels" -}}
{{- $own := index . 0 | fromYaml -}}
{{- $extra := index . 1 | default dict -}}
{{- $component := index . 2 -}}
{{- range $k, $_ := $extra -}}
{{- if hasKey $own $k -}}
{{- fail (printf "%s.podLabels: %q is the chart's own label, which the %s's selector uses; choose another key" $component $k $component) -}}
{{- end -}}
{{- end -}}
{{- toYaml (merge (dict) $own $extra) -}}
{{- end -}}

{{/*
metalvip.nanoseconds: a Go duration string, whose form values.schema.json checked, in
nanoseconds (a float: exact to 104 days).
*/}}
{{- define "metalvip.nanoseconds" -}}
{{- $unit := dict "ns" 1.0 "us" 1000.0 "µs" 1000.0 "ms" 1000000.0 "s" 1000000000.0 "m" 60000000000.0 "h" 3600000000000.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|h|m|s)" . -1 -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
metalvip.cloudConfig.check fails the render on what the CCM would refuse at start and a JSON
schema cannot say: durations out of range, two subnet rules for one CIDR. The bounds are the
CCM's (provider/config); test/integration/chart_settings_test.go holds the two together.
*/}}
{{- define "metalvip.cloudConfig.check" -}}
{{- $c := .Values.cloudConfig -}}
{{- range list
  (list "agent.enroll.validity" (dig "agent" "enroll" "validity" "" $c) "10m" "2160h")
  (list "failover.interval" (dig "failover" "interval" "" $c) "10ms" "10s")
  (list "failover.gratuitousRefresh" (dig "failover" "gratuitousRefresh" "" $c) "1s" "")
  (list "allocation.pendingRetry" (dig "allocation" "pendingRetry" "" $c) "1s" "")
  (list "allocation.poolStatusInterval" (dig "allocation" "poolStatusInterval" "" $c) "100ms" "")
  (list "drain.delay" (dig "drain" "delay" "" $c) "" "10m") -}}
{{- $path := index . 0 -}}{{- $v := index . 1 -}}{{- $min := index . 2 -}}{{- $max := index . 3 -}}
{{- $d := include "metalvip.nanoseconds" $v | float64 -}}
{{- /* Zero is the default, as for the CCM. */ -}}
{{- if and $v (gt $d 0.0) -}}
{{- $short := and $min (lt $d (include "metalvip.nanoseconds" $min | float64)) -}}
{{- $long := and $max (gt $d (include "metalvip.nanoseconds" $max | float64)) -}}
{{- if or $short $long -}}
{{- $want := printf "at least %s" $min -}}
{{- if and $min $max }}{{ $want = printf "%s to %s" $min $max }}{{ else if $max }}{{ $want = printf "at most %s" $max }}{{ end -}}
{{- fail (printf "cloudConfig.%s: %s is out of range; write %s" $path $v $want) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $r := dig "topology" "subnets" list $c -}}
{{- with index $seen $r.cidr -}}
{{- fail (printf "cloudConfig.topology.subnets[%d].cidr: %s is already mapped by topology.subnets[%s]; merge the two rules" $i $r.cidr .) -}}
{{- end -}}
{{- $_ := set $seen $r.cidr (toString $i) -}}
{{- end -}}
{{- end -}}
