#!/usr/bin/env python3
"""Generates protocol/src/guard/schemas.rs from kafka-protocol's generated
request decoders, so the guard walks exactly the fields the decoder reads.

Usage: gen_guard_schemas.py <kafka-protocol-src-dir> > protocol/src/guard/schemas.rs

Regenerate when upgrading kafka-protocol; the round-trip tests in
protocol/tests/roundtrip.rs catch any drift, and protocol/tests/alloc_bound.rs
any decoded size that no longer covers what decoding allocates.
"""
import re
import sys

# (const prefix, file stem, api key name)
APIS = [
    ("PRODUCE", "produce_request", "Produce"),
    ("FETCH", "fetch_request", "Fetch"),
    ("LIST_OFFSETS", "list_offsets_request", "ListOffsets"),
    ("METADATA", "metadata_request", "Metadata"),
    ("OFFSET_COMMIT", "offset_commit_request", "OffsetCommit"),
    ("OFFSET_FETCH", "offset_fetch_request", "OffsetFetch"),
    ("FIND_COORDINATOR", "find_coordinator_request", "FindCoordinator"),
    ("JOIN_GROUP", "join_group_request", "JoinGroup"),
    ("HEARTBEAT", "heartbeat_request", "Heartbeat"),
    ("LEAVE_GROUP", "leave_group_request", "LeaveGroup"),
    ("SYNC_GROUP", "sync_group_request", "SyncGroup"),
    ("DESCRIBE_GROUPS", "describe_groups_request", "DescribeGroups"),
    ("LIST_GROUPS", "list_groups_request", "ListGroups"),
    ("API_VERSIONS", "api_versions_request", "ApiVersions"),
    ("CREATE_TOPICS", "create_topics_request", "CreateTopics"),
    ("DELETE_TOPICS", "delete_topics_request", "DeleteTopics"),
    ("DELETE_RECORDS", "delete_records_request", "DeleteRecords"),
    ("INIT_PRODUCER_ID", "init_producer_id_request", "InitProducerId"),
    ("DESCRIBE_CONFIGS", "describe_configs_request", "DescribeConfigs"),
    ("DELETE_GROUPS", "delete_groups_request", "DeleteGroups"),
    ("CREATE_PARTITIONS", "create_partitions_request", "CreatePartitions"),
    ("OFFSET_DELETE", "offset_delete_request", "OffsetDelete"),
    ("DESCRIBE_CLUSTER", "describe_cluster_request", "DescribeCluster"),
    ("CONSUMER_GROUP_HEARTBEAT", "consumer_group_heartbeat_request", "ConsumerGroupHeartbeat"),
    ("CONSUMER_GROUP_DESCRIBE", "consumer_group_describe_request", "ConsumerGroupDescribe"),
    ("ALTER_CONFIGS", "alter_configs_request", "AlterConfigs"),
    ("INCREMENTAL_ALTER_CONFIGS", "incremental_alter_configs_request", "IncrementalAlterConfigs"),
    ("OFFSET_FOR_LEADER_EPOCH", "offset_for_leader_epoch_request", "OffsetForLeaderEpoch"),
    ("DESCRIBE_QUORUM", "describe_quorum_request", "DescribeQuorum"),
    ("WRITE_TXN_MARKERS", "write_txn_markers_request", "WriteTxnMarkers"),
    ("DESCRIBE_PRODUCERS", "describe_producers_request", "DescribeProducers"),
    ("ELECT_LEADERS", "elect_leaders_request", "ElectLeaders"),
    ("DESCRIBE_LOG_DIRS", "describe_log_dirs_request", "DescribeLogDirs"),
    ("TXN_OFFSET_COMMIT", "txn_offset_commit_request", "TxnOffsetCommit"),
    ("ADD_PARTITIONS_TO_TXN", "add_partitions_to_txn_request", "AddPartitionsToTxn"),
    ("ADD_OFFSETS_TO_TXN", "add_offsets_to_txn_request", "AddOffsetsToTxn"),
    ("END_TXN", "end_txn_request", "EndTxn"),
    ("DESCRIBE_TRANSACTIONS", "describe_transactions_request", "DescribeTransactions"),
    ("LIST_TRANSACTIONS", "list_transactions_request", "ListTransactions"),
    ("DESCRIBE_ACLS", "describe_acls_request", "DescribeAcls"),
    ("CREATE_ACLS", "create_acls_request", "CreateAcls"),
    ("DELETE_ACLS", "delete_acls_request", "DeleteAcls"),
    ("SASL_HANDSHAKE", "sasl_handshake_request", "SaslHandshake"),
    ("DESCRIBE_CLIENT_QUOTAS", "describe_client_quotas_request", "DescribeClientQuotas"),
    ("ALTER_CLIENT_QUOTAS", "alter_client_quotas_request", "AlterClientQuotas"),
    ("SASL_AUTHENTICATE", "sasl_authenticate_request", "SaslAuthenticate"),
    ("SHARE_GROUP_HEARTBEAT", "share_group_heartbeat_request", "ShareGroupHeartbeat"),
    ("SHARE_GROUP_DESCRIBE", "share_group_describe_request", "ShareGroupDescribe"),
    ("SHARE_FETCH", "share_fetch_request", "ShareFetch"),
    ("SHARE_ACKNOWLEDGE", "share_acknowledge_request", "ShareAcknowledge"),
    ("DESCRIBE_SHARE_GROUP_OFFSETS", "describe_share_group_offsets_request", "DescribeShareGroupOffsets"),
    ("ALTER_SHARE_GROUP_OFFSETS", "alter_share_group_offsets_request", "AlterShareGroupOffsets"),
    ("DELETE_SHARE_GROUP_OFFSETS", "delete_share_group_offsets_request", "DeleteShareGroupOffsets"),
    ("DESCRIBE_USER_SCRAM_CREDENTIALS", "describe_user_scram_credentials_request", "DescribeUserScramCredentials"),
    ("ALTER_USER_SCRAM_CREDENTIALS", "alter_user_scram_credentials_request", "AlterUserScramCredentials"),
    ("INITIALIZE_SHARE_GROUP_STATE", "initialize_share_group_state_request", "InitializeShareGroupState"),
    ("READ_SHARE_GROUP_STATE", "read_share_group_state_request", "ReadShareGroupState"),
    ("WRITE_SHARE_GROUP_STATE", "write_share_group_state_request", "WriteShareGroupState"),
    ("DELETE_SHARE_GROUP_STATE", "delete_share_group_state_request", "DeleteShareGroupState"),
    ("READ_SHARE_GROUP_STATE_SUMMARY", "read_share_group_state_summary_request", "ReadShareGroupStateSummary"),
]

# Versions newer than kafka-protocol decodes, which protocol/src/newer.rs
# decodes as the version below: prefix -> (newest version, [(the field the
# new one follows, its name, its type)]), top-level fields only.
NEWER = {
    "SHARE_FETCH": (2, [("batch_size", "share_acquire_mode", "INT8"),
                        ("share_acquire_mode", "is_renew_ack", "BOOL")]),
    "SHARE_ACKNOWLEDGE": (2, [("share_session_epoch", "is_renew_ack", "BOOL")]),
    "DESCRIBE_SHARE_GROUP_OFFSETS": (1, []),
}

ALL = frozenset(range(0, 64))
PRIMS = {
    "Int8": "INT8", "Int16": "INT16", "Int32": "INT32", "Int64": "INT64",
    "Uuid": "UUID", "Float64": "FLOAT64", "Boolean": "BOOL",
    "String": "STRING", "CompactString": "STRING",
    "Bytes": "BYTES", "CompactBytes": "BYTES",
}


def snake_upper(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def cond_set(cond):
    cond = cond.strip()
    parts = [p.strip() for p in cond.split("&&")]
    s = set(ALL)
    for p in parts:
        m = re.fullmatch(r"version (>=|<=|==|!=|<|>) (\d+)", p)
        if not m:
            raise SystemExit(f"unknown condition {cond!r}")
        op, n = m.group(1), int(m.group(2))
        f = {">=": lambda v: v >= n, "<=": lambda v: v <= n, "==": lambda v: v == n,
             "!=": lambda v: v != n, "<": lambda v: v < n, ">": lambda v: v > n}[op]
        s = {v for v in s if f(v)}
    return frozenset(s)


def field_types(text):
    """(struct, field) -> rust type, from `pub struct X { pub f: T, ... }`."""
    out = {}
    for m in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
        for fm in re.finditer(r"pub (\w+): (.+?),\n", m.group(2) + "\n"):
            out[(m.group(1), fm.group(1))] = fm.group(2)
    return out


def parse_decoders(text):
    """struct name -> (valid versions, flexible_from, [field dicts])."""
    structs = {}
    for m in re.finditer(r"impl Decodable for (\w+) \{\n(.*?)\n\}\n", text, re.S):
        name, body = m.group(1), m.group(2)
        body = body.replace("types::Struct { version }", "types::Struct")
        lines = [l.strip() for l in body.split("\n")]
        # Join wrapped decode expressions onto one line.
        joined = []
        for l in lines:
            if joined and (l.startswith(".decode(") or l.startswith(".")):
                joined[-1] += l
            else:
                joined.append(l)
        stack = []  # entries: (kind, set, extra)
        fields = []
        current = None
        valid = None
        flex = None
        skipping = 0
        for l in joined:
            if l.startswith("fn decode"):
                continue
            if l.startswith("Ok(Self {"):
                break
            if skipping:
                skipping += l.count("{") - l.count("}")
                continue
            m2 = re.match(r"if version < (\d+) \|\| version > (\d+) \{", l)
            m3 = re.match(r"if version != (\d+) \{", l)
            if m2 or m3:
                valid = (int(m2.group(1)), int(m2.group(2))) if m2 else (int(m3.group(1)),) * 2
                skipping = 1
                continue
            active = ALL
            for _, s, _ in stack:
                active = active & s
            tag = next((e for k, _, e in reversed(stack) if k == "tag"), None)
            if "num_tagged_fields = " in l:
                flex = min(active)
                continue
            if l.startswith("let tag:") or l.startswith("let size:") or "unknown_value" in l \
                    or l.startswith("let mut ") or l.startswith("bail!"):
                continue
            mlet = re.match(r"let (\w+) = if (.*) \{$", l)
            if mlet:
                current = mlet.group(1)
                stack.append(("if", cond_set(mlet.group(2)), None))
                continue
            mif = re.match(r"if (.*) \{$", l)
            if mif:
                stack.append(("if", cond_set(mif.group(1)), None))
                continue
            if l == "} else {":
                k, s, e = stack.pop()
                stack.append((k, ALL - s, e))
                continue
            if l in ("}", "};"):
                stack.pop()
                continue
            if l.startswith("for _ in") or l == "match tag {" or l == "_ => {":
                stack.append(("block" if l != "_ => {" else "unknown", ALL, None))
                continue
            mtag = re.match(r"(\d+) => \{$", l)
            if mtag:
                stack.append(("tag", ALL, int(mtag.group(1))))
                continue
            mdec = re.match(r"(?:let (\w+) = |(\w+) = )?(types::.*)\.decode\(buf\)\?;?$", l)
            if mdec:
                fname = mdec.group(1) or mdec.group(2) or current
                if mdec.group(1):
                    current = None
                expr = mdec.group(3)
                fields.append({"name": fname, "expr": expr, "versions": active, "tag": tag})
                continue
            if re.fullmatch(r"let \w+ = [^;]*;", l) and ".decode(" not in l:
                continue  # a field this version range never reads
            if l.startswith("(") or l.startswith("Default::") or l.startswith("StrBytes::") \
                    or l.startswith("Uuid::") or re.fullmatch(r"-?[\d.]+|true|false|None|Vec::new\(\)|Some\(.*\)|\w+", l):
                continue  # default values in else branches
            raise SystemExit(f"{name}: unhandled line {l!r}")
        structs[name] = (valid, flex, fields)
    return structs


def merge_fields(fields):
    """A field decoded in several branches (compact / non-compact) becomes one."""
    out = []
    for f in fields:
        same = [g for g in out if g["name"] == f["name"] and g["tag"] == f["tag"]]
        if same:
            same[0]["versions"] = same[0]["versions"] | f["versions"]
            same[0]["exprs"].append((f["expr"], f["versions"]))
        else:
            out.append({**f, "exprs": [(f["expr"], f["versions"])]})
    return out


def ty_of(expr, struct, fname, ftypes, prefix, stem, needed):
    compact = expr.startswith("types::Compact")
    m = re.fullmatch(r"types::(?:Compact)?Array\((types::\w+)\)", expr)
    if m:
        inner = m.group(1)
        if inner == "types::Struct":
            rust = ftypes[(struct, fname)]
            elem = re.search(r"Vec<(\w+)>", rust).group(1)
            needed.append(elem)
            # The decoder allocates count x this per array: the guard adds it
            # up so the broker can charge a request's decoded size up front.
            return (f"array_of(&Ty::Struct({prefix}_{snake_upper(elem)}), "
                    f"size_of::<km::{stem}::{elem}>())"), compact
        return f"array(&{PRIMS[inner[len('types::'):]]})", compact
    if expr == "types::Struct":
        rust = ftypes[(struct, fname)]
        needed.append(rust)
        return f"Ty::Struct({prefix}_{snake_upper(rust)})", False
    prim = expr[len("types::"):]
    return PRIMS[prim], prim.startswith("Compact")


def vrange(vs, valid):
    vs = sorted(v for v in vs if valid[0] <= v <= valid[1])
    if not vs:
        return None
    if vs != list(range(vs[0], vs[-1] + 1)):
        raise SystemExit(f"non-contiguous versions {vs}")
    lo, hi = vs[0], vs[-1]
    return lo, ("MAX" if hi == valid[1] else str(hi))


def main():
    src = sys.argv[1]
    out = ["// @generated by protocol/tools/gen_guard_schemas.py from kafka-protocol 0.18.0's",
           "// request decoders, and the fields of newer versions in its NEWER table. Do not edit",
           "// by hand: regenerate and let the round-trip tests judge.",
           "// `MAX` means \"up to the newest version\".",
           "",
           "use kafka_protocol::messages as km;",
           "",
           "use super::schema::*;", ""]
    for prefix, stem, api in APIS:
        text = open(f"{src}/messages/{stem}.rs").read()
        ftypes = field_types(text)
        decs = parse_decoders(text)
        top = [n for n in decs if n.endswith("Request")][0]
        valid, flex, _ = decs[top]
        newest, added = NEWER.get(prefix, (valid[1], []))
        out.append(f"pub(crate) const {prefix}: Message = Message {{")
        out.append(f"    versions: ({valid[0]}, {newest}),")
        out.append(f"    flexible_from: {flex if flex is not None else 'NEVER'},")
        out.append(f"    body: {prefix}_BODY,")
        out.append("};")
        done = set()
        queue = [top]
        while queue:
            struct = queue.pop(0)
            if struct in done:
                continue
            done.add(struct)
            svalid, sflex, sfields = decs[struct]
            if sflex != flex:
                raise SystemExit(f"{struct}: flexible from {sflex} but message from {flex}")
            needed = []
            rows = []
            for f in merge_fields(sfields):
                r = vrange(f["versions"], valid)
                if r is None:
                    continue
                ty, _ = ty_of(f["exprs"][0][0], struct, f["name"], ftypes, prefix, stem, needed)
                for expr, vs in f["exprs"]:
                    t2, compact = ty_of(expr, struct, f["name"], ftypes, prefix, stem, [])
                    if t2 != ty:
                        raise SystemExit(f"{struct}.{f['name']}: branch types differ")
                    if "Compact" in expr:
                        if flex is None or min(vs) < flex:
                            raise SystemExit(f"{struct}.{f['name']}: compact before flexible")
                    elif expr.startswith(("types::String", "types::Bytes", "types::Array")) and \
                            flex is not None and max(v for v in vs) >= flex and max(vs) < 63:
                        raise SystemExit(f"{struct}.{f['name']}: non-compact in flexible version")
                if f["name"] == "records" and ty == "BYTES":
                    ty = "RECORDS"
                if f["tag"] is None:
                    rows.append(f'    field("{f["name"]}", {r[0]}, {r[1]}, {ty}),')
                    if struct == top:
                        after = f["name"]
                        for prev, name, nty in added:
                            if prev == after:
                                rows.append(f'    field("{name}", {newest}, MAX, {nty}),')
                                after = name
                else:
                    rows.append(f'    tagged({f["tag"]}, "{f["name"]}", {r[0]}, {r[1]}, {ty}),')
            cname = f"{prefix}_BODY" if struct == top else f"{prefix}_{snake_upper(struct)}"
            out.append(f"const {cname}: &[Field] = &[")
            out.extend(rows)
            out.append("];")
            queue.extend(needed)
        out.append("")
    print("\n".join(out))


main()
