#!/usr/bin/env bash
# Bring up a small real Kubernetes API server on loopback for the k8s launcher tests: Debian's etcd and the
# kube-apiserver .ci/kube-build.sh builds (from Debian 12's kubernetes source package), token auth, the LWS CRD
# (launchers/k8s/crd/lws-crd-k8s120.yaml: the LWS project's CRD made acceptable to 1.20) installed.
# No controller-manager, scheduler or kubelet: tests/lws_standin.py plays the LWS controller and a kubelet.
# Idempotent: an API server that answers with our token is reused. Builds the binary when it is missing.
#
#   etcd            127.0.0.1:23790 (peer 23800)    data: /var/lib/dspark-kube/etcd
#   kube-apiserver  https://127.0.0.1:16443         certs, tokens, keys: /etc/dspark-kube
#   kubeconfig      /etc/dspark-kube/kubeconfig     logs: /var/log/dspark-ci/kube
#
# Prints export-able lines (stdout) for the caller:  eval "$(bash .ci/kube-up.sh)"   Stop: .ci/kube-down.sh
set -euo pipefail
cd "$(dirname "$0")/.."
conf=${DSPARK_KUBE_CONF_DIR:-/etc/dspark-kube}
state=${DSPARK_KUBE_STATE_DIR:-/var/lib/dspark-kube}
logs=${DSPARK_KUBE_LOG_DIR:-/var/log/dspark-ci/kube}
run=${DSPARK_KUBE_RUN_DIR:-/run/dspark-kube}
port=16443 etcd_port=23790
crd=${DSPARK_LWS_CRD_120:-$PWD/launchers/k8s/crd/lws-crd-k8s120.yaml}
kubeconfig=$conf/kubeconfig
say() { echo "kube-up: $*" >&2; }
mkdir -p "$conf" "$state" "$logs" "$run"

answers() {
    [ -f "$conf/token" ] && curl -sf --max-time 3 --cacert "$conf/pki/apiserver.crt" \
        -H "Authorization: Bearer $(cat "$conf/token")" "https://127.0.0.1:$port/readyz" >/dev/null 2>&1
}

source .ci/pidfile.sh

if ! answers; then
    apiserver=$(bash .ci/kube-build.sh 2>>"$logs/kube-build.log" | tail -1)
    [ -x "$apiserver" ] || { say "no kube-apiserver (see $logs/kube-build.log)"; exit 1; }
    # Keys and certificates: service-account signing key, the API server's serving cert (for 127.0.0.1), the
    # kubelet serving cert the stand-in uses (the API server verifies it when it streams logs).
    mkdir -p "$conf/pki"
    if [ ! -f "$conf/pki/sa.key" ]; then
        openssl genrsa -out "$conf/pki/sa.key" 2048 2>/dev/null
    fi
    for name in apiserver kubelet; do
        if [ ! -f "$conf/pki/$name.crt" ]; then
            openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=dspark-$name" \
                -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
                -keyout "$conf/pki/$name.key" -out "$conf/pki/$name.crt" 2>/dev/null
        fi
    done
    if [ ! -f "$conf/token" ]; then
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$conf/token"
        chmod 600 "$conf/token"
    fi
    echo "$(cat "$conf/token"),dspark-ci,dspark-ci,system:masters" >"$conf/tokens.csv"
    chmod 600 "$conf/tokens.csv"
    if ! pid_alive "$run/etcd.pid" etcd; then
        say "starting etcd on 127.0.0.1:$etcd_port"
        nohup etcd --name dspark --data-dir "$state/etcd" \
            --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
            --listen-peer-urls "http://127.0.0.1:23800" --initial-advertise-peer-urls "http://127.0.0.1:23800" \
            --initial-cluster "dspark=http://127.0.0.1:23800" >"$logs/etcd.log" 2>&1 &
        echo $! >"$run/etcd.pid"
    fi
    etcd_answers() { curl -sf --max-time 3 "http://127.0.0.1:$etcd_port/health" >/dev/null; }
    for _ in $(seq 50); do etcd_answers && break; sleep 0.2; done
    etcd_answers || { say "etcd did not answer on 127.0.0.1:$etcd_port; tail of $logs/etcd.log:";
                      tail -20 "$logs/etcd.log" >&2; exit 1; }
    pid_stop "$run/kube-apiserver.pid" "$apiserver"
    say "starting kube-apiserver on 127.0.0.1:$port"
    nohup "$apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" --etcd-prefix /dspark-registry \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
        --tls-cert-file "$conf/pki/apiserver.crt" --tls-private-key-file "$conf/pki/apiserver.key" \
        --token-auth-file "$conf/tokens.csv" --authorization-mode RBAC --anonymous-auth=false \
        --service-account-key-file "$conf/pki/sa.key" --service-account-signing-key-file "$conf/pki/sa.key" \
        --service-account-issuer https://kubernetes.default.svc \
        --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true \
        --disable-admission-plugins ServiceAccount \
        --kubelet-certificate-authority "$conf/pki/kubelet.crt" --kubelet-preferred-address-types InternalIP \
        >"$logs/kube-apiserver.log" 2>&1 &
    echo $! >"$run/kube-apiserver.pid"
    for _ in $(seq 120); do answers && break; pid_alive "$run/kube-apiserver.pid" "$apiserver" || break; sleep 0.5; done
    answers || { say "kube-apiserver did not become ready; tail of $logs/kube-apiserver.log:";
                 tail -20 "$logs/kube-apiserver.log" >&2; exit 1; }
fi

cat >"$kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: dspark
  cluster: {server: "https://127.0.0.1:$port", certificate-authority: "$conf/pki/apiserver.crt"}
users:
- name: dspark-ci
  user: {token: "$(cat "$conf/token")"}
contexts:
- name: dspark
  context: {cluster: dspark, user: dspark-ci, namespace: default}
current-context: dspark
KC
chmod 600 "$kubeconfig"

# The LWS CRD (a create, not a client-side apply: the CRD is too large for the last-applied annotation).
python3 - "$kubeconfig" "$crd" <<'PY' >&2
import sys, time, yaml
from kubernetes import client, config
api = client.ApiextensionsV1Api(config.new_client_from_config(config_file=sys.argv[1]))
body = yaml.safe_load(open(sys.argv[2]))
name = body["metadata"]["name"]
try:
    api.read_custom_resource_definition(name)
    print(f"kube-up: CRD {name} installed already")
except client.exceptions.ApiException as err:
    if err.status != 404:
        raise
    api.create_custom_resource_definition(body)
    print(f"kube-up: CRD {name} created")
for _ in range(100):
    conds = api.read_custom_resource_definition(name).status.conditions or []
    if any(c.type == "Established" and c.status == "True" for c in conds):
        break
    time.sleep(0.2)
else:
    sys.exit(f"kube-up: CRD {name} not Established")
PY
echo "export DSPARK_KUBECONFIG=$kubeconfig"
echo "export DSPARK_KUBELET_CERT=$conf/pki/kubelet.crt DSPARK_KUBELET_KEY=$conf/pki/kubelet.key"
