{{/*
Names, labels, images and ServiceAccount names shared by every template of the chart.
Components: "operator", "agent", "gateway". Selector labels never include the chart version,
so upgrades keep matching the pods they already own.
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified prefix of object names: fullnameOverride, else "<release>-<name>", or the
release name alone when it already contains the name. Truncated to leave room for suffixes.
*/}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<name>-<version>" for the helm.sh/chart label. */}}
{{- define "tessera.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of a component's objects: (dict "ctx" $ "component" "agent") -> "<fullname>-agent". */}}
{{- define "tessera.componentName" -}}
{{- printf "%s-%s" (include "tessera.fullname" .ctx) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that identify a component's pods; also used by selectors and NetworkPolicies. */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every label of a component's objects: selector labels plus version and ownership. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ include "tessera.chart" .ctx }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- with .ctx.Values.global.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Agent selector as a label-selector string, for the operator's --agent-selector. */}}
{{- define "tessera.agentSelector" -}}
{{- if .Values.operator.agentSelector }}
{{- .Values.operator.agentSelector }}
{{- else }}
{{- $labels := include "tessera.selectorLabels" (dict "ctx" . "component" "agent") | fromYaml }}
{{- $pairs := list }}
{{- range $k := keys $labels | sortAlpha }}
{{- $pairs = append $pairs (printf "%s=%s" $k (get $labels $k)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
{{- end }}

{{/*
Image reference of a component: (dict "ctx" $ "image" .Values.agent.image).
repository@digest when a digest is set, else repository:tag with tag defaulting to appVersion.
*/}}
{{- define "tessera.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag | toString) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets block of a pod spec (global.imagePullSecrets), or "". */}}
{{- define "tessera.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* ServiceAccount names. */}}
{{- define "tessera.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "tessera.componentName" (dict "ctx" . "component" "operator")) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tessera.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "tessera.componentName" (dict "ctx" . "component" "agent")) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces the operator serves: the list, or nothing for all namespaces. */}}
{{- define "tessera.operator.allNamespaces" -}}
{{- if not .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{/* Namespace where the operator looks for agent pods. */}}
{{- define "tessera.agentNamespace" -}}
{{- default .Release.Namespace .Values.operator.agentNamespace }}
{{- end }}

{{/* Name of the ConfigMap holding the gateway defaults. */}}
{{- define "tessera.gatewayDefaultsName" -}}
{{- printf "%s-gateway-defaults" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Arguments of `tessera operator` (tessera.cli.operator_cmd), one per line. Scope: --namespace
per watched namespace, or --all-namespaces. Peering: none with one replica (kopf then runs
standalone); with more, --peering NAME (the pod template adds a distinct --priority).
*/}}
{{- define "tessera.operator.args" -}}
{{- $o := .Values.operator -}}
- operator
- --agent-selector
- {{ include "tessera.agentSelector" . | quote }}
- --agent-namespace
- {{ include "tessera.agentNamespace" . | quote }}
- --agent-port
- {{ .Values.agent.port | quote }}
- --model-root
- {{ .Values.modelCache.mountPath | quote }}
- --gateway-config
- /etc/tessera/gateway.json
{{- range $o.admission.allowedModelRoots }}
- --allowed-model-root
- {{ . | quote }}
{{- end }}
{{- if $o.admission.allowLoadBalancer }}
- --allow-load-balancer
{{- end }}
{{- $host := $o.admission.allowHostPath }}
{{- if or (eq (toString $host) "true") (and (eq (toString $host) "auto") (eq .Values.modelCache.type "hostPath")) }}
- --allow-host-path
{{- end }}
{{- if $o.watchNamespaces }}
{{- range $o.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if gt (int $o.replicas) 1 }}
- --peering
- {{ $o.peering.name | quote }}
{{- end }}
{{- if $o.livenessProbe.enabled }}
- --liveness
- {{ printf "http://0.0.0.0:%d/healthz" (int $o.livenessProbe.port) | quote }}
{{- end }}
{{- with $o.logLevel }}
- {{ printf "--%s" . | quote }}
{{- end }}
{{- range $o.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The model cache as a pod volume named "model-cache". */}}
{{- define "tessera.modelCacheVolume" -}}
{{- $mc := .Values.modelCache -}}
- name: model-cache
{{- if eq $mc.type "hostPath" }}
  hostPath:
    path: {{ $mc.hostPath.path }}
    type: {{ $mc.hostPath.type }}
{{- else if eq $mc.type "pvc" }}
  persistentVolumeClaim:
    claimName: {{ $mc.pvc.claimName }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}

{{/*
Labels the operator puts on every gateway pod and Service it creates
(tessera_operator.gateway_objects.labels): the NetworkPolicy and the ServiceMonitor select
gateways by them. app.kubernetes.io/instance is the ServingDeployment's name there.
*/}}
{{- define "tessera.gatewaySelectorLabels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/component: gateway
app.kubernetes.io/managed-by: tessera-operator
{{- end }}

{{/*
Name of the TLS Secret of a component ("operator", "agent", "gateway"): tls.secrets.<c>, or
"<fullname>-<c>-tls" (what the cert-manager Certificates write). Call with
(dict "ctx" $ "component" "agent").
*/}}
{{- define "tessera.tlsSecretName" -}}
{{- $given := index .ctx.Values.tls.secrets .component -}}
{{- default (printf "%s-%s-tls" (include "tessera.fullname" .ctx) .component | trunc 63 | trimSuffix "-") $given -}}
{{- end }}

{{/* Namespaces that get a gateway Certificate: tls.certManager.gatewayNamespaces, else the watched ones. */}}
{{- define "tessera.gatewayCertNamespaces" -}}
{{- $ns := .Values.tls.certManager.gatewayNamespaces | default .Values.operator.watchNamespaces -}}
{{- toJson (default (list) $ns) -}}
{{- end }}

{{/*
The operator's rules on namespaced objects: in its ClusterRole when it watches every
namespace, else in a Role per watched namespace (templates/operator/rbac.yaml).
*/}}
{{- define "tessera.operator.namespacedRules" -}}
# kopf: watches ServingDeployments; patches them for its finalizer and progress annotations.
- apiGroups: ["serving.tessera.dev"]
  resources: ["servingdeployments"]
  verbs: ["list", "watch", "patch"]
# Status, written last with observedGeneration.
- apiGroups: ["serving.tessera.dev"]
  resources: ["servingdeployments/status"]
  verbs: ["patch"]
# Events on ServingDeployments (kopf's and the operator's own).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Per ServingDeployment: the gateway Deployment, Service and routes ConfigMap, created or
# replaced when their desired spec changes; deleted with it by owner references.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "update"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "create", "update"]
{{- if include "tessera.certPerDeployment" . }}
# tls.certManager.perDeployment: a gateway Certificate per ServingDeployment, bound to it.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "create", "update"]
{{- end }}
{{- end }}

{{/*
A NetworkPolicyPeer for this release's pods of a component: their namespace (by the
kubernetes.io/metadata.name label Kubernetes sets) AND their labels, so a pod elsewhere
that copies the labels does not match. Call with (dict "ctx" $ "component" "agent").
*/}}
{{- define "tessera.peer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .ctx.Release.Namespace }}
  podSelector:
    matchLabels:
      {{- include "tessera.selectorLabels" . | nindent 6 }}
{{- end }}

{{/* The gateways (in the watched namespaces, or any namespace) as a NetworkPolicyPeer. */}}
{{- define "tessera.gatewayPeer" -}}
- namespaceSelector:
    {{- if .Values.operator.watchNamespaces }}
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values:
          {{- toYaml .Values.operator.watchNamespaces | nindent 10 }}
    {{- else }}
    {}
    {{- end }}
  podSelector:
    matchLabels:
      {{- include "tessera.gatewaySelectorLabels" . | nindent 6 }}
{{- end }}

{{/* The egress rule to DNS (networkPolicy.dns: peers, on port 53 UDP and TCP). */}}
{{- define "tessera.dnsEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.dns | nindent 4 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}

{{/*
The agents the operator serves with (operator.agentNamespace and operator.agentSelector, or
this release's agents) as a NetworkPolicyPeer: where the operator and gateways may connect.
*/}}
{{- define "tessera.agentPeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ include "tessera.agentNamespace" . }}
  podSelector:
    matchLabels:
      {{- range splitList "," (include "tessera.agentSelector" .) }}
      {{- if not (regexMatch "^[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*$" .) }}
      {{- fail (printf "networkPolicy.enabled needs operator.agentSelector made of key=value pairs (got %q)" .) }}
      {{- end }}
      {{- $kv := splitn "=" 2 . }}
      {{ $kv._0 }}: {{ $kv._1 | quote }}
      {{- end }}
{{- end }}

{{/* The issuer of every Tessera certificate as JSON: tls.certManager.issuerRef, or the chart's CA ClusterIssuer. */}}
{{- define "tessera.certIssuer" -}}
{{- $issuer := .Values.tls.certManager.issuerRef -}}
{{- if not $issuer }}
{{- $issuer = dict "kind" "ClusterIssuer" "name" (printf "%s-ca" (include "tessera.fullname" .)) }}
{{- end }}
{{- toJson (dict "kind" $issuer.kind "name" $issuer.name) -}}
{{- end }}

{{/* "true" when the operator asks cert-manager for one gateway certificate per ServingDeployment. */}}
{{- define "tessera.certPerDeployment" -}}
{{- $cm := .Values.tls.certManager -}}
{{- if and .Values.tls.enabled $cm.enabled $cm.perDeployment }}true{{ end }}
{{- end }}
