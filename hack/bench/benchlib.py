"""Helpers the benchmarks' Python snippets share (hack/bench/roll.sh, hack/bench/failover.sh):
timestamps of the KcpShard's status and of kcp's klog lines as Unix seconds."""
import time
from datetime import datetime


def ts(value):
    """An RFC 3339 time of the status (MicroTime or Time) as Unix seconds; None stays None."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def klog_times(path, needle):
    """The times of the klog lines of a slot's kcp.log that contain needle (klog writes local time
    without the year: `I1201 14:03:07.123456 ...`)."""
    times = []
    try:
        for line in open(path, errors="replace"):
            if needle in line and line[:1] in "IWE":
                fields = line.split()
                at = datetime.strptime(f"{time.localtime().tm_year}{fields[0][1:]} {fields[1]}", "%Y%m%d %H:%M:%S.%f")
                times.append(at.timestamp())
    except (OSError, ValueError, IndexError):
        pass
    return times
