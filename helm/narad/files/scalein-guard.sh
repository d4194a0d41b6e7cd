# The chart's scale-in guard (OPERATIONS.md §10.1, CLUSTER.md §10), run by the pre-upgrade and
# pre-rollback hook Job templates/scalein-guard-job.yaml as `/bin/sh -c <this file>`. The upgrade
# (or rollback) sets the StatefulSet to SCALEIN_GUARD_REPLICAS pods, deleting pods
# <SCALEIN_GUARD_STATEFULSET>-<i> for every i >= that; a pod's name is its node id. The guard asks
# the cluster for its members (`narad cluster members`: the image has no curl) and refuses (exit 1,
# naming the pods) while any pod to be deleted is still listed. It fails closed: an answer it
# cannot read, no answer, or a refusal (401/403) is a refusal too. allowScaleInTo equal to the new
# size (SCALEIN_GUARD_ALLOW) approves the upgrade without asking.
#
# POSIX sh (the image's /bin/sh is dash); writes no file. Environment: SCALEIN_GUARD_STATEFULSET,
# SCALEIN_GUARD_REPLICAS, SCALEIN_GUARD_ALLOW, SCALEIN_GUARD_CREDENTIALS (where the credentials
# come from, for messages); NARAD_ADDR, NARAD_USER, NARAD_PASS for the CLI (OPERATIONS.md §1.2).
sts=${SCALEIN_GUARD_STATEFULSET:?}
new=${SCALEIN_GUARD_REPLICAS:?}
allow=${SCALEIN_GUARD_ALLOW:-0}
creds=${SCALEIN_GUARD_CREDENTIALS:-none}
url="${NARAD_ADDR:-http://127.0.0.1:7942}/v1/cluster/members"

say() { printf 'scale-in guard: %s\n' "$*"; }

# Refuses with $1 (what went wrong), then how to approve.
refuse() {
    say "REFUSED: $1" >&2
    say "to let it through anyway (having checked the member list yourself), approve this size: helm upgrade ... --set replicaCount=$new --set allowScaleInTo=$new (scaleInGuard.enabled=false turns the guard off)" >&2
    exit 1
}

case $new in
    '' | *[!0-9]*) refuse "replicaCount '$new' is not a number" ;;
esac
if [ "$allow" = "$new" ]; then
    say "allowScaleInTo=$allow approves replicaCount=$new: members not checked"
    exit 0
fi

out=$(narad cluster members 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
    case $out in
        *'(HTTP 401)'* | *'(HTTP 403)'*)
            refuse "GET $url was refused with the guard's credentials ($creds): $out
The members route needs an admin. Without the member list the guard cannot tell whether the pods this upgrade deletes are members, so it refuses. Give it an admin's credentials: scaleInGuard.credentialsSecret names a Secret with the keys username and password." ;;
        *)
            refuse "could not list the members (GET $url, narad exited $rc): $out
Without the member list the guard cannot tell whether the pods this upgrade deletes are members, so it refuses." ;;
    esac
fi

# The CLI prints the answer as indented JSON, one field a line: {"members":[{...},...]}. A member's
# fields are the lines at depth 3 (root object, members array, member object); its object ends at
# a line starting with } that leaves depth 3. Nested values (decommission_blocked) are deeper.
depth=0 found= listed= blocked= details=
id= status= draining=false owned='?'
while IFS= read -r line; do
    t=${line#"${line%%[![:space:]]*}"}
    case $t in
        '}'* | ']'*)
            if [ "$depth" -eq 3 ] && [ -n "$id" ]; then
                listed="$listed $id"
                case $id in
                    "$sts"-*)
                        ord=${id#"$sts"-}
                        case $ord in
                            '' | *[!0-9]*) ;;
                            *)
                                if [ "$ord" -ge "$new" ]; then
                                    blocked="$blocked $id"
                                    d=$([ "$draining" = true ] && echo draining || echo 'not draining')
                                    details="$details
  $id: status $status, $d, owns $owned partition(s)"
                                fi
                                ;;
                        esac
                        ;;
                esac
            fi
            [ "$depth" -eq 3 ] && { id= status= draining=false owned='?'; }
            depth=$((depth - 1))
            ;;
    esac
    case $depth:$t in
        '1:"members": ['* | '1:"members": []'*) found=yes ;;
        '3:"id": "'*) id=${t#'"id": "'}; id=${id%%'"'*} ;;
        '3:"status": "'*) status=${t#'"status": "'}; status=${status%%'"'*} ;;
        '3:"draining": true'*) draining=true ;;
        '3:"owned_partitions": '*) owned=${t#'"owned_partitions": '}; owned=${owned%,} ;;
    esac
    case $t in
        *'{' | *'[') depth=$((depth + 1)) ;;
    esac
done <<EOF
$out
EOF

[ -n "$found" ] || refuse "GET $url answered without a member list: $out"
if [ -n "$blocked" ]; then
    refuse "replicaCount=$new deletes the pods${blocked}, which the cluster still lists as members:$details
Deleting a member's pod strands the partitions it owns (CLUSTER.md §10). Decommission them first, highest ordinal first (narad cluster decommission <pod>), and wait until \`narad cluster members\` no longer lists them."
fi
say "replicaCount=$new keeps $sts-0..$sts-$((new - 1)); the members are${listed:- (none)}: no pod to be deleted is a member"
exit 0
