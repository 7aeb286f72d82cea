"""NCCL_DEBUG logs: values of the interesting lines of each corpus log (read by hand, line cited),
then grammar variants from ../shared/reference/nccl.md section 1 on handmade lines."""

from __future__ import annotations

import calendar
import json
from functools import lru_cache

from conftest import corpus

from pipeline.ingest import nccl


@lru_cache(maxsize=None)
def parsed(name: str):
    return nccl.parse(corpus("nccl", name).read_bytes(), name)


def rows(p, table: str) -> list[dict]:
    return p.tables[table].to_dicts() if table in p.tables else []


def at(p, table: str, line_no: int) -> list[dict]:
    return [r for r in rows(p, table) if r["line_no"] == line_no]


def one(p, table: str, line_no: int) -> dict:
    rs = at(p, table, line_no)
    assert len(rs) == 1, (table, line_no, rs)
    return rs[0]


def detail(row: dict) -> dict:
    return json.loads(row["detail"])


def text(src: str):
    return nccl.parse(src.encode(), "handmade.log")


# --- corpus -------------------------------------------------------------------------------------------


def test_aws_eks_mpirun_log():
    p = parsed("aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log")
    # line 17: "[1,0]<stdout>:NCCL version 2.12.7+cuda11.4" (bare, rank 0 only)
    assert p.tool_versions["nccl_version"] == "2.12.7" and p.tool_versions["cuda_version"] == "11.4"
    v = one(p, "nccl_events", 17)
    assert (v["kind"], v["wrapper"], v["wrapper_rank"]) == ("version", "[1,0]<stdout>:", 0)
    # line 11: "NET/OFI Using aws-ofi-nccl 1.5.0aws"
    assert p.tool_versions["aws_ofi_nccl"] == "1.5.0aws"
    assert p.host is None and p.world_size == 2
    procs = {r["host"]: r for r in rows(p, "nccl_processes")}
    assert set(procs) == {"node01", "node02"}
    n1 = procs["node01"]
    # line 52: "node01:21:27 [0] NCCL INFO comm 0x7fde98000f60 rank 0 nranks 2 cudaDev 0 busId 35000
    #           - Init COMPLETE"
    assert (n1["pid"], n1["tid"], n1["comm_ptr"], n1["rank"], n1["nranks"], n1["cuda_dev"], n1["bus_id"]) == (
        21,
        27,
        "0x7fde98000f60",
        0,
        2,
        0,
        "35000",
    )
    assert n1["pci_bus_id"] == "0000:35:00.0" and n1["init_complete_line_no"] == 52
    # line 90: "... comm 0x7fde98000f60 rank 0 nranks 2 cudaDev 0 busId 35000 - Destroy COMPLETE"
    assert n1["status"] == "destroyed" and n1["end_line_no"] == 90
    # lines 45-46 (same thread 21:27, before Init COMPLETE): thresholds and channel counts
    assert n1["thread_thresholds"] == "8/8/64 | 16/8/64 | 8/8/512"
    assert (n1["n_coll_channels"], n1["n_p2p_channels"], n1["n_p2p_channels_per_peer"]) == (2, 2, 2)
    assert n1["n_nvls_channels"] is None
    # line 27: "Setting affinity for GPU 0 to ff,ffff0000,00ffffff"; line 30: "Channel 00/02 :    0   1"
    assert n1["cpu_affinity"] == "ff,ffff0000,00ffffff" and n1["n_ring_channels"] == 2
    # line 16: "Using network AWS Libfabric";
    # line 6: "#  Rank  0 Group  0 Pid     21 on node01 device  0 [0x35] Tesla T4"
    assert n1["net_name"] == "AWS Libfabric" and n1["gpu_name"] == "Tesla T4"
    assert n1["nccl_version"] == "2.12.7"
    n2 = procs["node02"]
    # line 51: "node02:21:26 [0] ... comm 0x7f9c0c000f60 rank 1 nranks 2 cudaDev 0 busId f5000
    #           - Init COMPLETE"
    assert (n2["comm_ptr"], n2["rank"], n2["bus_id"], n2["pci_bus_id"]) == (
        "0x7f9c0c000f60",
        1,
        "f5000",
        "0000:f5:00.0",
    )
    assert n2["cpu_affinity"] == "ffffff00,0000ffff,ff000000"  # line 28
    assert n2["n_ring_channels"] is None  # only rank 0 prints ring orders
    # line 35: "node02:21:26 [0] NCCL INFO Channel 00/0 : 0[35000] -> 1[f5000] [receive]
    #           via NET/AWS Libfabric/0"
    c = one(p, "nccl_channels", 35)
    assert (c["channel"], c["conn_index"], c["src_rank"], c["dst_rank"], c["direction"], c["rank"]) == (
        0,
        0,
        0,
        1,
        "receive",
        1,
    )
    assert (c["src_bus_id"], c["dst_bus_id"], c["src_nvml_dev"]) == ("35000", "f5000", None)
    assert (c["transport"], c["net_name"], c["net_dev"], c["gdr"]) == ("NET", "AWS Libfabric", 0, False)
    assert c["comm_ptr"] == "0x7f9c0c000f60"  # tied at the thread's Init COMPLETE (line 51)
    # line 40: "node01:21:27 [0] ... Channel 00/0 : 0[35000] -> 1[f5000] [send] via NET/AWS Libfabric/0"
    c = one(p, "nccl_channels", 40)
    assert (c["direction"], c["rank"], c["comm_ptr"]) == ("send", 0, "0x7fde98000f60")
    # line 29: "node02:21:26 [0] NCCL INFO Trees [0] -1/-1/-1->1->0 [1] 0/-1/-1->1->-1"
    t0, t1 = sorted(at(p, "nccl_rings", 29), key=lambda r: r["channel"])
    assert (t0["kind"], t0["rank"], t0["up"], t0["down"]) == ("tree", 1, [0], [])
    assert (t1["rank"], t1["up"], t1["down"]) == (1, [], [0])
    r = one(p, "nccl_rings", 30)
    assert (r["kind"], r["channel"], r["n_channels"], r["ranks"], r["truncated"]) == (
        "ring",
        0,
        2,
        [0, 1],
        False,
    )
    # line 15: "NET/OFI Selected Provider is efa (found 1 nics)";
    # line 8: "Bootstrap : Using eth0:192.0.2.2<0>"
    o = one(p, "nccl_net_devices", 15)
    assert (o["kind"], o["provider"], o["n_nics"], o["host"]) == ("ofi", "efa", 1, "node01")
    b = one(p, "nccl_net_devices", 8)
    assert (b["kind"], b["dev_name"], b["ip"]) == ("bootstrap", "eth0", "192.0.2.2")
    # line 57: an INFO line inside the results table ("Launch mode Parallel") is an event
    e = one(p, "nccl_events", 57)
    assert (e["kind"], e["message"], e["tid"]) == ("init", "Launch mode Parallel", 21)
    # lines 1-2: ssh warnings kept with their text
    assert one(p, "nccl_events", 1)["text"].startswith("Warning: Permanently added 'node02.cluster.local")
    assert one(p, "nccl_events", 33)["kind"] == "env"  # "NCCL_SHM_DISABLE set by environment to 0."
    assert detail(one(p, "nccl_events", 33)) == {"var": "NCCL_SHM_DISABLE", "value": "0"}


def test_1189_net_ib_gdrdma_and_p2p_cumem():
    p = parsed("nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log")
    # line 1: "node02:4015539:4015652 [0] NCCL INFO Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA"
    c = one(p, "nccl_channels", 1)
    assert (c["channel"], c["src_rank"], c["dst_rank"], c["src_nvml_dev"], c["dst_nvml_dev"]) == (
        7,
        0,
        2,
        0,
        0,
    )
    assert (c["direction"], c["rank"], c["transport"], c["net_name"], c["net_dev"], c["gdr"]) == (
        "receive",
        2,
        "NET",
        "IB",
        3,
        True,
    )
    assert c["src_bus_id"] is None and c["comm_ptr"] is None
    # line 6: "... Channel 01/0 : 3[1] -> 1[1] [send] via NET/IB/2/GDRDMA"
    c = one(p, "nccl_channels", 6)
    assert (c["direction"], c["rank"], c["net_dev"]) == ("send", 3, 2)
    # line 10: "node02:4015540:4015653 [1] NCCL INFO Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM"
    c = one(p, "nccl_channels", 10)
    assert (c["transport"], c["p2p_mode"], c["p2p_read"], c["direction"], c["rank"], c["via"]) == (
        "P2P",
        "CUMEM",
        False,
        None,
        3,
        "P2P/CUMEM",
    )
    df = p.tables["nccl_channels"]
    assert df.filter(df["transport"] == "NET").height == 9 and df.filter(df["transport"] == "P2P").height == 5
    assert p.host is None  # node01 and node02


def test_1193_coll_behind_ray_prefix():
    p = parsed("nccl-issue-1193-coll-allreduce-ray-prefix-128rank.log")
    # line 1: "(RayTrainWorker pid=615, ip=192.0.2.1) node01:615:18953 [2] NCCL INFO AllReduce: opCount 139d
    #          sendbuff 0x78d056200000 recvbuff 0x78d056200000 count 7382228 datatype 7 op 0 root 0
    #          comm 0x78cfda045840 [nranks=128] stream 0x78d07125e5e0"
    c = one(p, "nccl_coll_calls", 1)
    assert (c["host"], c["pid"], c["tid"], c["cuda_dev"], c["op"], c["op_count"]) == (
        "node01",
        615,
        18953,
        2,
        "AllReduce",
        0x139D,
    )
    assert (c["count"], c["datatype_id"], c["datatype"], c["dtype_bytes"], c["bytes"], c["msg_bytes"]) == (
        7382228,
        7,
        "float32",
        4,
        7382228 * 4,
        7382228 * 4,
    )
    assert (c["redop"], c["root"], c["peer"], c["nranks"]) == ("sum", None, None, 128)
    assert (c["comm_ptr"], c["stream"], c["sendbuff"]) == (
        "0x78cfda045840",
        "0x78d07125e5e0",
        "0x78d056200000",
    )
    # line 3: "node03:619:19049 [3] ... AllReduce: opCount 139e ... count 7066572 datatype 7 ..."
    c = one(p, "nccl_coll_calls", 3)
    assert (c["op_count"], c["count"], c["bytes"]) == (0x139E, 7066572, 7066572 * 4)
    assert p.world_size == 128


def test_1405_warn_and_error_chains():
    p = parsed("nccl-issue-1405-warn-net-ib-completion-status12-error-chain.log")
    # line 1: "node01:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer
    #          192.0.2.1<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)
    #          localGid 2001:db8::3:ff22 remoteGids2001:db8::3:ff1f"
    w = one(p, "nccl_events", 1)
    assert (w["kind"], w["level"], w["src_file"], w["src_line"], w["error_chain"]) == (
        "warn",
        "WARN",
        "ib_plugin.c",
        1615,
        1,
    )
    assert detail(w) == {
        "peer": "192.0.2.1<54862>",
        "ib_status": 12,
        "ib_status_name": "IBV_WC_RETRY_EXC_ERR",
        "opcode": 0,
        "len": 0,
        "vendor_err": 129,
        "direction": "Recv",
        "local_gid": "2001:db8::3:ff22",
        "remote_gid": "2001:db8::3:ff1f",
    }
    # lines 2-4: "transport/net.cc:1302 -> 6", "proxy.cc:698 -> 6", "proxy.cc:878 -> 6 [Progress Thread]"
    chain = [one(p, "nccl_events", n) for n in (2, 3, 4)]
    assert [(r["kind"], r["src_file"], r["src_line"], r["result_code"], r["error_chain"]) for r in chain] == [
        ("error_chain", "transport/net.cc", 1302, 6, 1),
        ("error_chain", "proxy.cc", 698, 6, 1),
        ("error_chain", "proxy.cc", 878, 6, 1),
    ]
    assert detail(chain[2]) == {"result": "ncclRemoteError", "thread": "Progress Thread"}
    # line 6: second WARN (opcode=32616) starts a new chain; line 13 belongs to the third (line 11)
    assert (
        detail(one(p, "nccl_events", 6))["opcode"] == 32616 and one(p, "nccl_events", 7)["error_chain"] == 6
    )
    assert one(p, "nccl_events", 13)["error_chain"] == 11
    assert p.host == "node01"


def test_1412_init_complete_and_timings():
    p = parsed("nccl-issue-1412-init-complete-and-init-timings-16rank.log")
    procs = {(r["rank"], r["comm_ptr"]): r for r in rows(p, "nccl_processes")}
    # line 2: "node01:2017630:2017675 [6] NCCL INFO ncclCommInitRank comm 0x8ec0ac0 rank 6 nranks 16 cudaDev 6
    #          nvmlDev 6 busId c8000 commId 0x49bbd7790311d5eb - Init COMPLETE"
    r6 = procs[(6, "0x8ec0ac0")]
    assert (
        r6["init_func"],
        r6["nranks"],
        r6["cuda_dev"],
        r6["nvml_dev"],
        r6["bus_id"],
        r6["pci_bus_id"],
    ) == ("ncclCommInitRank", 16, 6, 6, "c8000", "0000:c8:00.0")
    assert r6["comm_id"] == "0x49bbd7790311d5eb" and r6["status"] == "init_complete"
    # line 3: "... [6] NCCL INFO Init timings: rank 6 nranks 16 total 1.08 (kernels 0.50, ...)" (same thread)
    assert r6["init_total_ns"] == 1_080_000_000
    # line 5: "... [0] ... comm 0x8d57d40 rank 0 ... busId 7000 ..."; line 6: timings rank 0 total 1.08
    r0 = procs[(0, "0x8d57d40")]
    assert r0["pci_bus_id"] == "0000:07:00.0" and r0["init_total_ns"] == 1_080_000_000
    # line 4: rank 4, no timings line
    assert procs[(4, "0x8e48640")]["init_total_ns"] is None
    # line 1: timings of rank 2 whose Init COMPLETE is not in the excerpt: its own row
    r2 = procs[(2, None)]
    assert (r2["cuda_dev"], r2["tid"], r2["nranks"], r2["init_total_ns"]) == (2, 2017671, 16, 1_080_000_000)
    d = detail(one(p, "nccl_events", 1))
    assert d == {
        "rank": 2,
        "nranks": 16,
        "total_ns": 1_080_000_000,
        "kernels_ns": 510_000_000,
        "bootstrap_ns": 220_000_000,
        "allgathers_ns": 10_000_000,
        "topo_ns": 280_000_000,
        "graphs_ns": 40_000_000,
        "connections_ns": 20_000_000,
        "rest_ns": 10_000_000,
    }
    assert {r["comm_id"] for r in rows(p, "nccl_processes") if r["comm_ptr"]} == {"0x49bbd7790311d5eb"}


def test_1453_nvls_heads_and_truncated_rings():
    p = parsed("nccl-issue-1453-init-h100-3node-nvls-heads-rings-truncated.log")
    (proc,) = rows(p, "nccl_processes")
    # line 4: "[0] node01:227602:227667 [0] NCCL INFO comm 0x5639e9f0e8c0 rank 0 nRanks 24 nNodes 3
    #          localRanks 8 localRank 0 MNNVL 0"
    assert (
        proc["comm_ptr"],
        proc["rank"],
        proc["nranks"],
        proc["n_nodes"],
        proc["local_ranks"],
        proc["local_rank"],
        proc["mnnvl"],
    ) == ("0x5639e9f0e8c0", 0, 24, 3, 8, 0, False)
    # line 1 affinity, line 2 "NVLS multicast support is available on dev 0" (same thread, before line 4)
    assert proc["cpu_affinity"] == "ffff,ffffffff,ffffffff" and proc["nvls_multicast"] is True
    assert proc["n_ring_channels"] == 16  # line 13: "Channel 00/16 :"
    # line 13: 20 ranks of a 24-rank ring: NCCL <= 2.22 caps the line at 20
    r = one(p, "nccl_rings", 13)
    assert r["ranks"] == [0, 7, 6, 5, 4, 3, 2, 1, 8, 15, 14, 13, 12, 11, 10, 9, 16, 23, 22, 21]
    assert (r["channel"], r["n_channels"], r["truncated"], r["comm_ptr"]) == (0, 16, True, "0x5639e9f0e8c0")
    # line 5: "NVLS Head  0:  0  8 16"; line 12: "NVLS Head  7:  7 15 23"
    assert (one(p, "nccl_rings", 5)["kind"], one(p, "nccl_rings", 5)["ranks"]) == ("nvls_head", [0, 8, 16])
    assert (one(p, "nccl_rings", 12)["channel"], one(p, "nccl_rings", 12)["ranks"]) == (7, [7, 15, 23])
    # line 3: "NCCL_CROSS_NIC set by environment to 2." behind the "[0] " launcher tag
    e = one(p, "nccl_events", 3)
    assert (
        detail(e) == {"var": "NCCL_CROSS_NIC", "value": "2"}
        and e["wrapper"] == "[0] "
        and e["wrapper_rank"] is None
    )


def test_1657_nccl_bootstrap_lines_next_to_pytorch():
    p = parsed("nccl-issue-1657-torch-processgroupnccl-init-env-and-nccl-bootstrap.log")
    # line 6: "node01:88:88 [0] NCCL INFO Bootstrap : Using net1:192.0.2.1<0>"
    b = one(p, "nccl_net_devices", 6)
    assert (b["kind"], b["dev_name"], b["ip"], b["pid"]) == ("bootstrap", "net1", "192.0.2.1", 88)
    # line 4: "NCCL_SOCKET_IFNAME set by environment to net1"; line 5: "NCCL_SOCKET_IFNAME set to net1"
    assert (
        detail(one(p, "nccl_events", 4))
        == detail(one(p, "nccl_events", 5))
        == {"var": "NCCL_SOCKET_IFNAME", "value": "net1"}
    )
    # line 2: PyTorch's "NCCL version: 2.21.5" is the only version in the file
    assert p.tool_versions["nccl_version"] == "2.21.5"


def test_1814_nvls_comm_then_ib_errors():
    p = parsed("nccl-issue-1814-init-complete-nvls-64rank-then-ib-status12.log")
    procs = {r["rank"]: r for r in rows(p, "nccl_processes")}
    assert set(procs) == {32, 34, 35, 36}
    # line 8: "node05:982:1255 [2] ... comm 0x560dfc7a10e0 rank 34 nranks 64 cudaDev 2 nvmlDev 2 busId 49000
    #          commId 0x5ae77eb5ea4ec1ee - Init COMPLETE"; lines 5-6 on the same thread:
    #          "threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
    #          "16 coll channels, 0 collnet channels, 16 nvls channels, 16 p2p channels,
    #          1 p2p channels per peer"
    r = procs[34]
    assert (r["comm_ptr"], r["nranks"], r["bus_id"], r["comm_id"]) == (
        "0x560dfc7a10e0",
        64,
        "49000",
        "0x5ae77eb5ea4ec1ee",
    )
    assert (
        r["n_coll_channels"],
        r["n_collnet_channels"],
        r["n_nvls_channels"],
        r["n_p2p_channels"],
        r["n_p2p_channels_per_peer"],
    ) == (16, 0, 16, 16, 1)
    assert r["thread_thresholds"] == "8/8/64 | 512/8/64 | 512 | 512"
    assert procs[36]["n_coll_channels"] is None  # pid 984 printed no counts in the excerpt
    # line 11: "node05:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer
    #           192.0.2.1<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv)
    #           localGid ::ffff:192.0.2.2 remoteGids::ffff:192.0.2.3"
    d = detail(one(p, "nccl_events", 11))
    assert (d["ib_status"], d["opcode"], d["len"], d["local_gid"], d["remote_gid"]) == (
        12,
        129,
        65536,
        "::ffff:192.0.2.2",
        "::ffff:192.0.2.3",
    )
    # line 16: "... with status=5 opcode=32656 len=32659 vendor err 249 (Recv) ..."
    d = detail(one(p, "nccl_events", 16))
    assert (d["ib_status"], d["ib_status_name"], d["vendor_err"]) == (5, "IBV_WC_WR_FLUSH_ERR", 249)
    # line 14: "proxy.cc:874 -> 6 [Progress Thread]" closes the first chain; line 19 the second
    assert (one(p, "nccl_events", 14)["error_chain"], one(p, "nccl_events", 19)["error_chain"]) == (11, 16)
    assert one(p, "nccl_events", 1)["message"] == "Connected NVLS tree"


def test_584_send_recv_nil_buffers():
    p = parsed("nccl-issue-584-coll-send-recv-nil-buffers.log")
    # line 1: "node01:199574:201142 [1] NCCL INFO Send: opCount 12 sendbuff 0x7f505e93c000 recvbuff (nil)
    #          count 2420736 datatype 7 op 0 root 1 comm 0x7f5128002e10 [nranks=2] stream 0x55f1de727ae0"
    c = one(p, "nccl_coll_calls", 1)
    assert (c["op"], c["op_count"], c["sendbuff"], c["recvbuff"], c["peer"], c["root"], c["redop"]) == (
        "Send",
        0x12,
        "0x7f505e93c000",
        None,
        1,
        None,
        None,
    )
    assert (c["bytes"], c["comm_ptr"], c["nranks"]) == (2420736 * 4, "0x7f5128002e10", 2)
    # line 8: "Send: opCount d60 ... root 0 comm 0x7f516c002e10 [nranks=2] stream 0x55f1de7279a0"
    c = one(p, "nccl_coll_calls", 8)
    assert (c["op_count"], c["peer"], c["comm_ptr"], c["stream"]) == (
        0xD60,
        0,
        "0x7f516c002e10",
        "0x55f1de7279a0",
    )
    # line 10: "Recv: opCount d60 sendbuff (nil) recvbuff 0x7f5176000000 ... root 1 comm 0x7f5128002e10"
    c = one(p, "nccl_coll_calls", 10)
    assert (c["op"], c["op_count"], c["sendbuff"], c["recvbuff"], c["peer"]) == (
        "Recv",
        0xD60,
        None,
        "0x7f5176000000",
        1,
    )
    # line 6: the poster's "..." elision is kept
    e = one(p, "nccl_events", 6)
    assert (e["kind"], e["text"]) == ("other", "...")


def test_892_single_process_p2p_direct_pointer():
    p = parsed("nccl-issue-892-single-node-h800-p2p-direct-pointer-channels.log")
    # line 6: "node01:33347:33365 [5] NCCL INFO Channel 00/0 : 5[5] -> 7[7] via P2P/direct pointer"
    c = one(p, "nccl_channels", 6)
    assert (c["cuda_dev"], c["rank"], c["src_rank"], c["dst_rank"], c["src_nvml_dev"], c["dst_nvml_dev"]) == (
        5,
        5,
        5,
        7,
        5,
        7,
    )
    assert (c["transport"], c["p2p_mode"], c["via"]) == ("P2P", "direct pointer", "P2P/direct pointer")
    df = p.tables["nccl_channels"]
    # lines 1,2,7,9,11,13,15 from thread 33361 (channels 0-6); lines 6,8,...,16 from 33365 (channels 0-5)
    assert sorted(df.filter(df["tid"] == 33361)["channel"].to_list()) == list(range(7))
    assert sorted(df.filter(df["tid"] == 33365)["channel"].to_list()) == list(range(6))
    # one process, GPUs 1, 3, 5, 7 seen (lines 1, 3, 4, 5)
    assert sorted(r["cuda_dev"] for r in rows(p, "nccl_processes")) == [1, 3, 5, 7]
    assert {r["pid"] for r in rows(p, "nccl_processes")} == {33347} and p.host == "node01"
    assert [one(p, "nccl_events", n)["kind"] for n in (3, 4, 5)] == ["connected"] * 3


def test_228_net_ib_devices_and_env():
    p = parsed("nccl-tests-issue-228-net-ib-using-hca-env-echo.log")
    # line 3: "node01:5181:5232 [2] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/IB [RO];
    #          OOB ibs85f0:192.0.2.1<0>"
    d0, d1 = sorted(at(p, "nccl_net_devices", 3), key=lambda r: r["dev_index"])
    assert (d0["kind"], d0["dev_index"], d0["dev_name"], d0["port"], d0["link_layer"]) == (
        "ib",
        0,
        "mlx5_0",
        1,
        "IB",
    )
    assert (d1["dev_name"], d1["relaxed_ordering"], d1["oob_if"], d1["oob_ip"]) == (
        "mlx5_2",
        True,
        "ibs85f0",
        "192.0.2.1",
    )
    assert p.tables["nccl_net_devices"].height == 8  # lines 3, 7, 11, 15 x 2 devices
    # line 2: "NCCL_IB_HCA set to mlx5_2:1,mlx5_0:1"
    assert detail(one(p, "nccl_events", 2)) == {"var": "NCCL_IB_HCA", "value": "mlx5_2:1,mlx5_0:1"}
    # line 4: "node01:5181:5232 [2] NCCL INFO Using network IB"
    procs = {r["pid"]: r for r in rows(p, "nccl_processes")}
    assert procs[5181]["net_name"] == "IB" and procs[5180]["net_name"] is None


def test_284_socket_channels_and_pxn():
    p = parsed("nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log")
    # line 4: "node01:3867861:3867877 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"
    c = one(p, "nccl_channels", 4)
    assert (c["rank"], c["transport"], c["net_name"], c["net_dev"], c["gdr"]) == (
        0,
        "NET",
        "Socket",
        0,
        False,
    )
    # line 14: "node01:3867861:3868235 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1"
    procs = {r["host"]: r for r in rows(p, "nccl_processes")}
    assert (procs["node01"]["ring_pxn"], procs["node01"]["ring_gdr"]) == (False, True)
    # line 2: "[Proxy Progress] Device 0 CPU core 0"; line 1: the results units line
    assert (
        one(p, "nccl_events", 2)["kind"] == "proxy"
        and one(p, "nccl_events", 1)["kind"] == "nccl_tests_header"
    )
    assert "nccl_tests_results" not in p.tables


def test_nvidia_doc_examples_2_30():
    p = parsed("nvidia-nccl-docs-2.30-logging-examples-by-subsystem.log")
    # line 1: "NCCL version 2.30.3+cuda13.0"
    assert (p.tool_versions["nccl_version"], p.tool_versions["cuda_version"]) == ("2.30.3", "13.0")
    # line 2: "[2026-05-05 06:16:47] node-01:189884:189884 [3] plugin/net.cc:334 NCCL WARN
    #          Failed to initialize any NET plugin"
    w = one(p, "nccl_events", 2)
    assert (w["kind"], w["host"], w["pid"], w["cuda_dev"], w["src_file"], w["src_line"]) == (
        "warn",
        "node-01",
        189884,
        3,
        "plugin/net.cc",
        334,
    )
    assert w["log_time"] == "2026-05-05 06:16:47"
    assert w["local_time_ns"] == calendar.timegm((2026, 5, 5, 6, 16, 47, 0, 0, 0)) * 10**9
    # line 19: "[Rank 0] ncclCommInitRankConfig comm 0x... rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId XXXX
    #           commId 0x... - Init START"
    (r,) = [x for x in rows(p, "nccl_processes") if x["pid"] == 1895902]
    assert (r["init_func"], r["status"], r["init_start_line_no"], r["bus_id"], r["pci_bus_id"]) == (
        "ncclCommInitRankConfig",
        "init_start",
        19,
        "XXXX",
        None,
    )
    # line 10: "node-01:986207:986207 NCCL CALL ncclSend(0,0x...,8388608,7,0,2,0x...,0x...)" (no [dev])
    e = one(p, "nccl_events", 10)
    assert (e["kind"], e["level"], e["cuda_dev"]) == ("call", "CALL", None)
    assert detail(e) == {
        "api": "ncclSend",
        "args": ["0", "0x...", "8388608", "7", "0", "2", "0x...", "0x..."],
    }
    # line 21: "Tree 0 : -1 -> 0 -> 1/-1/-1"; line 23: "Ring 00 : 1 -> 0 -> 1" (GRAPH subsystem)
    t = one(p, "nccl_rings", 21)
    assert (t["kind"], t["rank"], t["up"], t["down"]) == ("tree_graph", 0, [], [1])
    g = one(p, "nccl_rings", 23)
    assert (g["kind"], g["prev_rank"], g["rank"], g["next_rank"]) == ("ring_graph", 1, 0, 1)
    # line 28: "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct" (SHM has no /connIndex)
    c = one(p, "nccl_channels", 28)
    assert (c["transport"], c["conn_index"], c["via"]) == ("SHM", None, "SHM/direct/direct")
    # line 25: "AllReduce: opCount 0 sendbuff 0x... recvbuff 0x... count 2 datatype 7 op 0 root 0 comm 0x...
    #           [nranks=2] stream 0x..."
    c = one(p, "nccl_coll_calls", 25)
    assert (c["op_count"], c["count"], c["bytes"], c["comm_ptr"]) == (0, 2, 8, "0x...")
    # line 66: "Bootstrap timings total 0.001447 (create 0.000081, send 0.000255, recv 0.000268,
    #           ring 0.000068, delay 0.000000)"
    assert detail(one(p, "nccl_events", 66)) == {
        "total_ns": 1_447_000,
        "create_ns": 81_000,
        "send_ns": 255_000,
        "recv_ns": 268_000,
        "ring_ns": 68_000,
        "delay_ns": 0,
    }
    # line 68: "Init timings - ncclCommInitRankConfig: rank 0 nranks 2 total 0.37
    #           (kernels 0.28, alloc 0.05, ...)"
    (r,) = [x for x in rows(p, "nccl_processes") if x["pid"] == 1897505]
    assert (r["init_total_ns"], r["init_func"], r["nranks"]) == (370_000_000, "ncclCommInitRankConfig", 2)
    assert detail(one(p, "nccl_events", 68))["alloc_ns"] == 50_000_000
    # line 78: "AllReduce: 33554432 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}"
    assert detail(one(p, "nccl_events", 78)) == {
        "op": "AllReduce",
        "bytes": 33554432,
        "algo": "RING",
        "proto": "SIMPLE",
        "channel_lo": 0,
        "channel_hi": 31,
    }
    # line 34: "node-01:2056033:2056033 [1] NCCL INFO comm 0x... rank 1 nranks 4 cudaDev 1 busId XXXX
    #           - Destroy COMPLETE"
    (r,) = [x for x in rows(p, "nccl_processes") if x["pid"] == 2056033]
    assert (r["status"], r["rank"], r["nranks"], r["end_line_no"]) == ("destroyed", 1, 4, 34)
    assert one(p, "nccl_events", 31)["kind"] == "ras"  # "RAS thread started"


def test_tensorflow_nccl_2_4_legacy_grammar():
    p = parsed("tensorflow-issue-34375-nccl-2.4.7-legacy-ring-format-empty-hostname.log")
    # line 2: "NCCL version 2.4.7+cudaCUDA_MAJOR.CUDA_MINOR" (broken build: no CUDA version)
    assert p.tool_versions["nccl_version"] == "2.4.7" and "cuda_version" not in p.tool_versions
    (proc,) = rows(p, "nccl_processes")
    # line 12: ":5202:5683 [0] NCCL INFO comm 0x7f94740025b0 rank 0 nranks 2 cudaDev 0 nvmlDev 0
    #           - Init COMPLETE"
    assert (proc["host"], proc["pid"], proc["comm_ptr"], proc["nvml_dev"], proc["bus_id"]) == (
        "",
        5202,
        "0x7f94740025b0",
        0,
        None,
    )
    assert proc["cpu_affinity"] == "03,fffff000,003fffff" and proc["nccl_version"] == "2.4.7"  # line 4
    # line 7: ":5202:5683 [0] NCCL INFO Ring 00 : 1 -> 0 [receive] via NET/IB/0" (2.4 wording, no brackets)
    c = one(p, "nccl_channels", 7)
    assert (c["channel"], c["conn_index"], c["src_rank"], c["dst_rank"], c["direction"], c["rank"]) == (
        0,
        None,
        1,
        0,
        "receive",
        0,
    )
    assert (c["net_name"], c["net_dev"], c["comm_ptr"]) == ("IB", 0, "0x7f94740025b0")
    # line 6: ":5202:5683 [0] NCCL INFO Channel 00 :    0   1"
    r = one(p, "nccl_rings", 6)
    assert (r["ranks"], r["n_channels"], r["truncated"]) == ([0, 1], None, False)
    assert one(p, "nccl_events", 11)["message"] == "Using 256 threads, Min Comp Cap 6, Trees disabled"
    assert one(p, "nccl_events", 1)["kind"] == "other"  # TensorFlow's own line
    assert p.host is None  # the only host name is empty


def test_torchtitan_allgather_reducescatter_sizes():
    p = parsed("torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log")
    # line 1: "AllGather: opCount d ... count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0
    #          [nranks=2] ..."
    c = one(p, "nccl_coll_calls", 1)
    assert (c["op"], c["op_count"], c["bytes"], c["msg_bytes"], c["redop"]) == (
        "AllGather",
        0xD,
        2097152 * 4,
        2097152 * 4 * 2,
        None,
    )
    # line 2: "ReduceScatter: opCount e ... count 2097152 datatype 7 op 0 ..."
    c = one(p, "nccl_coll_calls", 2)
    assert (c["op"], c["op_count"], c["msg_bytes"], c["redop"]) == (
        "ReduceScatter",
        0xE,
        2097152 * 4 * 2,
        "sum",
    )
    # line 6: "AllReduce: opCount 10 ... count 1 datatype 7 ..."
    c = one(p, "nccl_coll_calls", 6)
    assert (c["op_count"], c["bytes"], c["msg_bytes"]) == (0x10, 4, 4)


def test_vllm_init_start_and_rings():
    p = parsed("vllm-issue-8447-init-start-2node-ib-ray-prefix-nccl2.20.5.log")
    (proc,) = rows(p, "nccl_processes")
    # line 5: "node01:561:561 [0] NCCL INFO comm 0x1476dca0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 23000
    #          commId 0xa015ae7e0a50005d - Init START";
    # line 9: "... nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"
    assert (proc["comm_ptr"], proc["comm_id"], proc["status"], proc["pci_bus_id"]) == (
        "0x1476dca0",
        "0xa015ae7e0a50005d",
        "init_start",
        "0000:23:00.0",
    )
    assert (proc["n_nodes"], proc["local_ranks"], proc["net_name"], proc["n_ring_channels"]) == (
        2,
        1,
        "IB",
        2,
    )
    # lines 10-11: "Channel 00/02 :    0   1" after Init START on the same thread
    for n in (10, 11):
        r = one(p, "nccl_rings", n)
        assert (r["ranks"], r["comm_id"], r["truncated"]) == ([0, 1], "0xa015ae7e0a50005d", False)
    # line 2: "INFO 09-12 23:40:47 pynccl.py:63] vLLM is using nccl==2.20.5"
    assert one(p, "nccl_events", 2)["kind"] == "app_version" and p.tool_versions["nccl_version"] == "2.20.5"
    assert one(p, "nccl_events", 6)["kind"] == "other"  # Ray-prefixed vLLM line


# --- grammar variants (handmade lines from nccl.md section 1) ---------------------------------------------


def test_spliced_lines_are_split():
    # nccl.md 1.3 (nccl#147): two writers on one line
    p = text(
        "host:32619:32711 [2] NCCL INFO host:32629:32629 [7] NCCL INFO Broadcast: opCount 5 sendbuff 0x1 "
        "recvbuff 0x1 count 10 datatype 9 op 0 root 3 comm 0xc [nranks=8] stream 0xs\n"
    )
    f = one(p, "nccl_events", 1)
    assert (f["kind"], f["pid"], f["cuda_dev"], f["message"]) == ("fragment", 32619, 2, "")
    c = one(p, "nccl_coll_calls", 1)
    assert (c["pid"], c["cuda_dev"], c["op"], c["root"], c["datatype"], c["bytes"]) == (
        32629,
        7,
        "Broadcast",
        3,
        "bfloat16",
        20,
    )
    assert p.notes == ["1 spliced lines (two writers on one line) split in two"]


def test_wrappers_and_crlf():
    p = text(
        "0: node01:1:2 [0] NCCL INFO Using network IB\r\n"
        "node02: node02:3:4 [1] NCCL INFO Using network Socket\r\n"
        "[rank5]:node03:5:6 [2] NCCL INFO Using network IB\r\n"
        "\x1b[2K 45%|####   | node04:7:8 [3] NCCL INFO Using network IB\r\n"
    )
    ev = rows(p, "nccl_events")
    assert [(e["host"], e["wrapper"], e["wrapper_rank"]) for e in ev] == [
        ("node01", "0: ", 0),
        ("node02", "node02: ", None),
        ("node03", "[rank5]:", 5),
        ("node04", "\x1b[2K 45%|####   | ", None),
    ]
    assert all(not e["text"].endswith("\r") for e in ev)


def test_timestamp_with_fraction_and_2_30_7_func_forms():
    p = text(
        "[2026-05-05 06:16:47.123] node-01:1:2 [0] transport.cc:10 (ncclTransportP2pSetup) "
        "NCCL WARN Cuda failure 'out of memory'\n"
        "node-01:1:2 [0] NCCL INFO init.cc:20 (ncclCommInitRank) -> 1\n"
        "node-01:1:2 [0] 12.345 ncclEnqueueCheck:99 NCCL TRACE trace text\n"
    )
    w = one(p, "nccl_events", 1)
    assert (w["func"], w["src_file"], w["src_line"], w["log_time"]) == (
        "ncclTransportP2pSetup",
        "transport.cc",
        10,
        "2026-05-05 06:16:47.123",
    )
    assert w["local_time_ns"] == calendar.timegm((2026, 5, 5, 6, 16, 47, 0, 0, 0)) * 10**9 + 123_000_000
    e = one(p, "nccl_events", 2)
    assert (e["kind"], e["func"], e["src_file"], e["result_code"], e["error_chain"]) == (
        "error_chain",
        "ncclCommInitRank",
        "init.cc",
        1,
        1,
    )
    assert detail(e) == {"result": "ncclUnhandledCudaError"}
    t = one(p, "nccl_events", 3)
    assert (t["kind"], t["src_file"], t["src_line"], t["message"]) == (
        "trace",
        "ncclEnqueueCheck",
        99,
        "trace text",
    )


def test_transport_variants():
    p = text(
        "n:1:2 [0] NCCL INFO Channel 02/1 : 0[0] -> 2[2] via P2P/indirect/1[1]\n"
        "n:1:2 [0] NCCL INFO Channel 03/0 : 0[0] -> 8[0] [send] via NET/IB/3(2)/GDRDMA/Shared\n"
        "n:1:2 [0] NCCL INFO Channel 04/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        "n:1:2 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/SHARP/0\n"
        "n:1:2 [0] NCCL INFO Channel 05 : 0[0] -> 1[1] via direct shared memory\n"
    )
    c = one(p, "nccl_channels", 1)
    assert (c["conn_index"], c["p2p_mode"], c["dst_nvml_dev"]) == (1, "indirect", 2)
    c = one(p, "nccl_channels", 2)
    assert (c["net_dev"], c["pxn_proxy_rank"], c["gdr"], c["shared"]) == (3, 2, True, True)
    assert one(p, "nccl_channels", 3)["p2p_read"] is True
    c = one(p, "nccl_channels", 4)
    assert (c["kind"], c["transport"], c["rank"], c["direction"], c["via"]) == (
        "collnet",
        "COLLNET",
        0,
        "send",
        "COLLNET/SHARP/0",
    )
    assert one(p, "nccl_channels", 5)["transport"] == "SHM"


def test_net_device_lists():
    p = text(
        "n:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB/SHARP ; OOB eth0:192.0.2.9<0>\n"
        "n:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.1<0> [1]eth1:192.0.2.5<0>\n"
    )
    ib = sorted(at(p, "nccl_net_devices", 1), key=lambda r: r["dev_index"])
    assert [(r["dev_name"], r["link_layer"], r["flags"], r["relaxed_ordering"]) for r in ib] == [
        ("mlx5_0", "RoCE", None, False),
        ("mlx5_1", "IB", "SHARP", False),
    ]
    so = sorted(at(p, "nccl_net_devices", 2), key=lambda r: r["dev_index"])
    assert [(r["kind"], r["dev_name"], r["ip"]) for r in so] == [
        ("socket", "eth0", "192.0.2.1"),
        ("socket", "eth1", "192.0.2.5"),
    ]


def test_split_init_abort_and_numeric_tuning():
    p = text(
        "n:1:2 [0] NCCL INFO ncclCommSplit comm 0xaa rank 1 nranks 4 cudaDev 0 nvmlDev 0 busId 1b000 "
        "commId 0x1 "
        "parent 0xbb color 7 key 3 - Init START\n"
        "n:1:2 [0] NCCL INFO 4 coll channels, 4 collnet channels, 0 nvls channels, 4 p2p channels, "
        "2 p2p channels per peer\n"
        "n:1:2 [0] NCCL INFO comm 0xaa rank 1 nranks 4 cudaDev 0 busId 1b000 - Abort COMPLETE\n"
        "n:1:2 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo 1 proto 2 time 35.5\n"
    )
    (r,) = rows(p, "nccl_processes")
    assert (r["init_func"], r["parent_comm_ptr"], r["split_color"], r["split_key"], r["comm_id"]) == (
        "ncclCommSplit",
        "0xbb",
        7,
        3,
        "0x1",
    )
    assert (
        r["n_coll_channels"],
        r["n_collnet_channels"],
        r["n_nvls_channels"],
        r["n_p2p_channels_per_peer"],
    ) == (4, 4, 0, 2)
    assert (r["status"], r["init_start_line_no"], r["end_line_no"]) == ("aborted", 1, 3)
    assert detail(one(p, "nccl_events", 4)) == {
        "op": "AllReduce",
        "bytes": 1048576,
        "algo": "RING",
        "proto": "SIMPLE",
        "time_us": 35.5,
    }


def test_coll_line_joined_to_its_communicator():
    p = text(
        "n:1:2 [3] NCCL INFO comm 0xab rank 5 nranks 8 cudaDev 3 nvmlDev 3 busId 3b000 commId 0xdeadbeef "
        "- Init COMPLETE\n"
        "n:1:9 [3] NCCL INFO ReduceScatter: opCount 1f sendbuff 0x1 recvbuff 0x2 count 100 datatype 6 op 4 "
        "root 0 "
        "comm 0xab [nranks=8] stream 0x3\n"
        "n:1:9 [3] NCCL INFO Reduce: opCount 20 sendbuff 0x1 recvbuff 0x2 count 100 datatype 11 op 7 root 2 "
        "comm 0xab [nranks=8] stream 0x3\n"
    )
    c = one(p, "nccl_coll_calls", 2)
    assert (c["comm_id"], c["rank"], c["datatype"], c["bytes"], c["msg_bytes"], c["redop"]) == (
        "0xdeadbeef",
        5,
        "float16",
        200,
        1600,
        "avg",
    )
    c = one(p, "nccl_coll_calls", 3)
    assert (c["root"], c["datatype"], c["dtype_bytes"], c["redop_id"], c["redop"]) == (
        2,
        "float8e5m2",
        1,
        7,
        "user",
    )


def test_invalid_utf8_is_replaced_and_noted():
    p = nccl.parse(b"n:1:2 [0] NCCL INFO Using network IB \xff\xfe\n", "x.log")
    assert p.notes[0] == "invalid UTF-8 replaced"
    assert one(p, "nccl_events", 1)["message"] == "Using network IB \ufffd\ufffd"
