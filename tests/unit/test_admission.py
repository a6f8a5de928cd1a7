"""Admission checks (gpuserve.admission): parsers against the tools' formats, and every check
against a healthy host (must pass) and a host with that one fault (must fail, naming the GPU)."""

from dataclasses import replace
from pathlib import Path

import pytest

from gpuserve import admission, stack
from gpuserve.admission import AdmissionSettings, Finding

FIX = Path(__file__).parent / "fixtures" / "gpus"
DEFAULT = AdmissionSettings()


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def healthy_nvidia(**changes) -> admission.NvidiaHealth:
    gpus = admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8.csv"))
    seen = admission.NvidiaHealth(
        gpus=gpus, nvlinks=admission.parse_nvlink_status(lines("nvidia_smi_nvlink_status_h200_x8.txt")),
        xids=[], driver_bus_ids=[g.bus_id[4:].lower() for g in gpus.gpus], fabric_manager="active")
    return replace(seen, **changes)


def with_field(gpu: int, name: str, value: str) -> admission.GpuHealthList:
    """The healthy H200 host with one field of one GPU changed."""
    rows = lines("nvidia_smi_admission_h200_x8.csv")
    parts = [p.strip() for p in rows[gpu].split(",")]
    parts[admission.QUERY_FIELDS.index(name)] = value
    rows[gpu] = ", ".join(parts)
    return admission.parse_gpu_health(rows)


def failed(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.check, f.gpu) for f in findings if not f.ok]


# --- parsers ------------------------------------------------------------------------------------
def test_query_parser_reads_every_field_of_every_gpu():
    gpus = admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8.csv"))
    assert gpus.error is None and len(gpus.gpus) == 8
    g = gpus.gpus[3]
    assert (g.index, g.bus_id) == (3, "00000000:5D:00.0") and g.uuid.startswith("GPU-")
    assert g.values["persistence_mode"] == "Enabled" and g.values["retired_pages.pending"] == "[N/A]"
    assert g.values["pcie.link.width.max"] == "16" and g.label == "GPU 3 (00000000:5D:00.0)"


def test_query_parser_reports_a_driver_failure_instead_of_zero_gpus():
    out = admission.parse_gpu_health(lines("nvidia_smi_driver_failed.txt") + ["nvidia-smi exited 9"])
    assert out.gpus == [] and "couldn't communicate with the NVIDIA driver" in out.error


def test_query_parser_rejects_an_unknown_field_message():
    out = admission.parse_gpu_health(['Field "remapped_rows.failure" is not a valid field to query.'])
    assert out.gpus == [] and "not a valid field" in out.error


def test_nvlink_parser_active_and_inactive_links():
    ok = admission.parse_nvlink_status(lines("nvidia_smi_nvlink_status_h200_x8.txt"))
    assert sorted(ok.links) == list(range(8)) and all(len(v) == 18 and all(v.values()) for v in ok.links.values())
    down = admission.parse_nvlink_status(lines("nvidia_smi_nvlink_status_h200_x8_link_down.txt"))
    assert [k for k, up in down.links[4].items() if not up] == [11]
    assert all(all(v.values()) for i, v in down.links.items() if i != 4)


def test_xid_parser_reads_journal_and_dmesg_lines_and_ignores_sxid_and_load_lines():
    xids = admission.parse_xids(lines("kernel_log_xid.txt"))
    assert [(x.pci, x.code) for x in xids] == [("0000:2a:00", 13), ("0000:9a:00", 79), ("0000:db:00", 63)]
    assert xids[1].text.startswith("NVRM: Xid (PCI:0000:9a:00): 79,") and "fallen off the bus" in xids[1].text


def test_value_helpers():
    assert admission.number("0") == 0 and admission.number("[N/A]") is None
    assert admission.number("[Not Supported]") is None and admission.number("16 x") == 16
    assert admission.flag("Enabled") and admission.flag("Yes") and admission.flag("1")
    assert admission.flag("Disabled") is False and admission.flag("No") is False and admission.flag("[N/A]") is None
    assert admission.pci_short("00000000:2A:00.0") == admission.pci_short("PCI:0000:2a:00") == "0:2a:00"
    # Grace trays: one GPU per PCI domain, all at bus 01:00; an XID names only its own GPU
    assert admission.pci_short("00000008:01:00.0") == admission.pci_short("PCI:0008:01:00") == "8:01:00"
    assert admission.pci_short("00000009:01:00.0") != admission.pci_short("PCI:0008:01:00")


def test_fact_output_sections_are_split_and_parsed():
    h = admission.SECTION
    out = ([f"{h}query"] + lines("nvidia_smi_admission_h200_x8.csv") + [f"{h}nvlink"]
           + lines("nvidia_smi_nvlink_status_h200_x8.txt") + [f"{h}driver", "0000:18:00.0", f"{h}kernel"]
           + lines("kernel_log_xid.txt") + [f"{h}fabric", "inactive"])
    seen = admission.parse_nvidia(out)
    assert len(seen.gpus.gpus) == 8 and len(seen.nvlinks.links) == 8 and len(seen.xids) == 3
    assert seen.driver_bus_ids == ["0000:18:00.0"] and seen.fabric_manager == "inactive"
    assert admission.parse_nvidia([f"{h}query", "nvidia-smi: command not found"]).fabric_manager is None


# --- checks: healthy passes, each fault fails exactly its check on its GPU -----------------------
def test_a_healthy_host_passes_every_check_and_reports_them_all():
    findings = admission.evaluate_nvidia(DEFAULT, healthy_nvidia(), 8, nvswitch=True)
    assert failed(findings) == []
    checks = {f.check for f in findings}
    assert checks == set(admission.CHECKS)
    per_gpu = {c for c in checks if c != "fabric_manager"}
    for i in range(8):   # every check is reported for every GPU
        assert {f.check for f in findings if f.gpu.startswith(f"GPU {i} ")} == per_gpu


FIELD_FAULTS = [
    ("persistence", "persistence_mode", "Disabled"),
    ("ecc_mode", "ecc.mode.current", "Disabled"),
    ("ecc_uncorrectable", "ecc.errors.uncorrected.volatile.total", "1"),
    ("retired_pages_pending", "retired_pages.pending", "Yes"),
    ("row_remap_failure", "remapped_rows.failure", "Yes"),
    ("row_remap_failure", "remapped_rows.failure", "1"),
    ("pcie_gen", "pcie.link.gen.current", "4"),
    ("pcie_width", "pcie.link.width.current", "8"),
]


@pytest.mark.parametrize("check,name,value", FIELD_FAULTS)
def test_each_field_fault_fails_its_check_on_its_gpu(check, name, value):
    seen = healthy_nvidia(gpus=with_field(5, name, value))
    findings = admission.evaluate_nvidia(DEFAULT, seen, 8, nvswitch=True)
    bad = [f for f in findings if not f.ok]
    assert [(f.check, f.gpu) for f in bad] == [(check, "GPU 5 (00000000:AB:00.0)")]
    assert value in bad[0].value and bad[0].threshold
    msg = bad[0].message("gpu-7")
    assert msg.startswith("gpu-7: GPU 5 (00000000:AB:00.0): " + check + " is ") and "(allowed: " in msg


def test_nvlink_down_fails_that_gpu_and_only_on_nvswitch_hosts():
    seen = healthy_nvidia(nvlinks=admission.parse_nvlink_status(lines("nvidia_smi_nvlink_status_h200_x8_link_down.txt")))
    bad = [f for f in admission.evaluate_nvidia(DEFAULT, seen, 8, nvswitch=True) if not f.ok]
    assert [(f.check, f.gpu, f.value) for f in bad] == [
        ("nvlink", "GPU 4 (00000000:9A:00.0)", "17/18 links active (down: link 11)")]
    assert failed(admission.evaluate_nvidia(DEFAULT, seen, 8, nvswitch=False)) == []
    no_links = healthy_nvidia(nvlinks=admission.NvLinks({}, None))
    assert len(failed(admission.evaluate_nvidia(DEFAULT, no_links, 8, nvswitch=True))) == 8


def test_fatal_xids_since_boot_fail_the_gpu_they_name_and_app_xids_do_not():
    seen = healthy_nvidia(xids=admission.parse_xids(lines("kernel_log_xid.txt")))
    bad = [f for f in admission.evaluate_nvidia(DEFAULT, seen, 8, nvswitch=True) if not f.ok]
    assert [(f.check, f.gpu) for f in bad] == [("xid", "GPU 4 (00000000:9A:00.0)"), ("xid", "GPU 7 (00000000:DB:00.0)")]
    assert "Xid 79 since boot: NVRM: Xid (PCI:0000:9a:00): 79" in bad[0].value
    # 13 (an application's graphics exception) is reported but is not fatal by default
    gpu1 = next(f for f in admission.evaluate_nvidia(DEFAULT, seen, 8, True) if f.check == "xid" and f.gpu.startswith("GPU 1 "))
    assert gpu1.ok and gpu1.value == "Xid 13 since boot"
    strict = replace(DEFAULT, xid_fatal=(13,))
    assert failed(admission.evaluate_nvidia(strict, seen, 8, True)) == [("xid", "GPU 1 (00000000:2A:00.0)")]


def test_a_gpu_missing_from_nvidia_smi_is_named_by_the_bus_id_the_driver_probed():
    gpus = admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8.csv")[:7])
    seen = healthy_nvidia(gpus=gpus, xids=admission.parse_xids(["NVRM: Xid (PCI:0000:db:00): 79, pid=0, GPU has fallen off the bus."]))
    bad = [f for f in admission.evaluate_nvidia(DEFAULT, seen, 8, True) if not f.ok]
    assert [(f.check, f.gpu) for f in bad] == [("visible", "GPU at 0000:db:00.0"), ("visible", "host"),
                                              ("xid", "GPU at 0000:db:00")]
    assert bad[1].value == "7 GPUs listed" and bad[1].threshold == "8 (gpu_count)"


def test_fabric_manager_must_be_active_on_nvswitch_hosts():
    bad = failed(admission.evaluate_nvidia(DEFAULT, healthy_nvidia(fabric_manager="failed"), 8, True))
    assert bad == [("fabric_manager", "host")]
    assert not any(f.check == "fabric_manager" for f in admission.evaluate_nvidia(DEFAULT, healthy_nvidia(), 8, False))


def test_the_faults_fixture_fails_one_check_per_gpu():
    seen = healthy_nvidia(gpus=admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8_faults.csv")))
    assert failed(admission.evaluate_nvidia(DEFAULT, seen, 8, True)) == [
        ("persistence", "GPU 1 (00000000:2A:00.0)"),
        ("ecc_uncorrectable", "GPU 2 (00000000:3A:00.0)"),
        ("retired_pages_pending", "GPU 3 (00000000:5D:00.0)"),
        ("row_remap_failure", "GPU 4 (00000000:9A:00.0)"),
        ("pcie_gen", "GPU 5 (00000000:AB:00.0)"),
        ("pcie_width", "GPU 6 (00000000:BA:00.0)"),
        ("ecc_mode", "GPU 7 (00000000:DB:00.0)"),
    ]


def test_thresholds_from_group_data_change_the_verdict():
    seen = healthy_nvidia(gpus=admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8_faults.csv")))
    lax = AdmissionSettings(max_uncorrectable_ecc=3, allow_pending_retired_pages=True, pcie_min_gen=3, pcie_min_width=8)
    assert failed(admission.evaluate_nvidia(lax, seen, 8, True)) == [
        ("persistence", "GPU 1 (00000000:2A:00.0)"), ("row_remap_failure", "GPU 4 (00000000:9A:00.0)"),
        ("ecc_mode", "GPU 7 (00000000:DB:00.0)")]
    pcie = next(f for f in admission.evaluate_nvidia(lax, seen, 8, True) if f.check == "pcie_gen" and f.gpu.startswith("GPU 5"))
    assert pcie.value == "Gen 3 (max Gen 5)" and pcie.threshold == ">= Gen 3 (admission_pcie_min_gen)"


def test_failure_message_names_host_gpu_check_value_and_threshold():
    seen = healthy_nvidia(gpus=with_field(2, "ecc.errors.uncorrected.volatile.total", "4"))
    msg = admission.failure_message("gpu-h200-01", admission.evaluate_nvidia(DEFAULT, seen, 8, True))
    assert msg.splitlines() == [
        "gpu-h200-01: GPU admission failed (1 check(s)); the host must not enter rotation:",
        "  - gpu-h200-01: GPU 2 (00000000:3A:00.0): ecc_uncorrectable is 4 (volatile) "
        "(allowed: <= 0 (admission_max_uncorrectable_ecc))"]


# --- AMD ----------------------------------------------------------------------------------------
def amd() -> admission.AmdHealth:
    return admission.parse_amd_smi_blocks(lines("amd_smi_metric_ecc_pcie_mi355x_x4.txt")
                                          + lines("amd_smi_static_bus_mi355x_x4.txt"))


def test_amd_smi_blocks_merge_metric_and_static():
    seen = amd()
    assert seen.error is None and [g.index for g in seen.gpus] == [0, 1, 2, 3]
    v = seen.gpus[1].values
    assert v["ECC.TOTAL_UNCORRECTABLE_COUNT"] == "2" and v["PCIE.SPEED"] == "32 GT/s"
    assert v["BUS.MAX_PCIE_WIDTH"] == "16" and seen.gpus[1].label == "GPU 1 (0000:15:00.0)"


def test_amd_checks_catch_ecc_width_and_speed_and_pass_the_healthy_gpu():
    findings = admission.evaluate_amd(DEFAULT, amd(), 4)
    assert failed(findings) == [("ecc_uncorrectable", "GPU 1 (0000:15:00.0)"), ("pcie_width", "GPU 2 (0000:65:00.0)"),
                                ("pcie_gen", "GPU 3 (0000:75:00.0)")]
    assert {f.check for f in findings if f.gpu.startswith("GPU 0 ")} == {"visible", "ecc_uncorrectable",
                                                                         "pcie_width", "pcie_gen"}
    assert failed(admission.evaluate_amd(replace(DEFAULT, pcie_min_gen=4, pcie_min_width=8), amd(), 4)) == [
        ("ecc_uncorrectable", "GPU 1 (0000:15:00.0)")]


def test_amd_without_driver_is_not_admitted():
    seen = admission.parse_amd_smi_blocks(["ERROR:root:Unable to detect any GPU devices"])
    assert failed(admission.evaluate_amd(DEFAULT, seen, 4)) == [("visible", "host")]


# --- group data ---------------------------------------------------------------------------------
def test_admission_group_data_defaults_and_validation():
    a = stack.settings_from({}).admission
    assert a == AdmissionSettings() and a.enabled and 79 in a.xid_fatal and 13 not in a.xid_fatal
    b = stack.settings_from({"admission": False, "admission_xid_fatal": "79,48", "admission_pcie_min_gen": "4",
                             "admission_max_uncorrectable_ecc": 2}).admission
    assert (b.enabled, b.xid_fatal, b.pcie_min_gen, b.max_uncorrectable_ecc) == (False, (48, 79), 4, 2)
    for data, key, words in [
        ({"admission": "no"}, "admission", "True or False"),
        ({"admission_xid_fatal": [79, "x"]}, "admission_xid_fatal", "list of XID numbers"),
        ({"admission_xid_fatal": 79}, "admission_xid_fatal", "list of XID numbers"),
        ({"admission_pcie_min_gen": 9}, "admission_pcie_min_gen", "None (the GPU's own maximum) or a whole number from 1 to 6"),
        ({"admission_pcie_min_width": 0}, "admission_pcie_min_width", "from 1 to 32"),
        ({"admission_max_uncorrectable_ecc": -1}, "admission_max_uncorrectable_ecc", "whole number"),
        ({"admission_allow_pending_retired_pages": "yes"}, "admission_allow_pending_retired_pages", "True or False"),
    ]:
        with pytest.raises(stack.StackConfigError) as err:
            stack.settings_from(data)
        assert err.value.key == key and words in err.value.message


# --- DCGM (dcgm: True, where dcgmi is installed) --------------------------------------------------
@pytest.mark.parametrize("fixture,bad_gpu,words", [
    ("dcgmi_diag_r1_dcgm3.json", 1, "Page Retirement/Row Remap: GPU 1 had uncorrectable memory errors"),
    ("dcgmi_diag_r1_dcgm4.json", 2, "software: Page retirement pending on GPU 2."),
])
def test_dcgm_diag_fails_the_gpu_it_names_in_either_json_layout(fixture, bad_gpu, words):
    diag = admission.parse_dcgm_diag(lines(fixture))
    assert diag.error is None and sorted(diag.results) == [0, 1, 2, 3]
    gpus = admission.parse_gpu_health(lines("nvidia_smi_admission_h200_x8.csv")[:4])
    seen = healthy_nvidia(gpus=gpus, driver_bus_ids=[], dcgm=diag)
    findings = admission.evaluate_nvidia(DEFAULT, seen, 4, nvswitch=True)
    bad = [f for f in findings if not f.ok]
    assert [(f.check, f.gpu.split(" (")[0]) for f in bad] == [("dcgm_diag", f"GPU {bad_gpu}")]
    assert words in bad[0].value and bad[0].threshold == "Pass (dcgmi diag -r 1)"
    assert sum(f.check == "dcgm_diag" and f.ok for f in findings) == 3   # a Skip is not a failure


def test_dcgm_not_run_is_no_check_and_no_report_is_a_failure():
    assert admission.parse_dcgm_diag([]) is None
    assert not any(f.check == "dcgm_diag" for f in admission.evaluate_nvidia(DEFAULT, healthy_nvidia(), 8, True))
    down = admission.parse_dcgm_diag(["Error: Unable to connect to host engine. Host engine connection invalid/disconnected."])
    assert failed(admission.evaluate_nvidia(DEFAULT, healthy_nvidia(dcgm=down), 8, True)) == [("dcgm_diag", "host")]
