"""One host-move pipeline (issue 28; docs/rollout.md):

    out -> drained -> stop -> change -> reboot if needed -> verify -> start -> gate -> bake -> in

Pure modules, no pyinfra:
    plan       the moves a rollout plans (Move, StackMove), their batches, budget and refusals
    commands   the commands of a move on a host (drain flag, pointers, stop, start, running requests)
    lock       the fleet-wide rollout lock's commands and rules
    preconditions  every precondition of a move, each a rule, with where it is asked
Host-changing modules (run other hosts' commands from inside the rollout's one operation):
    remote     each command on another host, bounded in time (MoveFailed names host and step)
    rebooting  the one reboot path: the converge's GPU-stack operation and every move reboot through it
    pipeline   the steps every host move shares: start -> gate -> in, and the reboot

The package itself exports the pure names (``from gpuserve.rollout import Move, drain_flag``), so
that importing it never imports pyinfra.
"""

from gpuserve.rollout.commands import (RUNNING_METRICS, drain_flag, into_rotation, out_of_rotation,
                                       parse_running, pointer_commands, read_pointers,
                                       running_requests, start, stop)
from gpuserve.rollout.lock import (LOCK_FILE, LOCK_HELD, LOCK_TAKEN, RUN_ID, LockHolder, lock_release,
                                   lock_replace, lock_take, parse_lock_output, stale_reason)
from gpuserve.rollout.plan import (PERCENT, ROLE_ORDER, RUN_KINDS, Move, RunKind, StackMove, batch_size,
                                   batches, canary_batches, canary_hosts_per_kind, canary_plan,
                                   fail_budget_refusal, reboot_refusals, rollback_move, run_kind,
                                   skipped_message, stack_moves_first, upgrade_move)

__all__ = ["RUNNING_METRICS", "drain_flag", "into_rotation", "out_of_rotation", "parse_running",
           "pointer_commands", "read_pointers", "running_requests", "start", "stop",
           "LOCK_FILE", "LOCK_HELD", "LOCK_TAKEN", "RUN_ID", "LockHolder", "lock_release", "lock_replace",
           "lock_take", "parse_lock_output", "stale_reason",
           "PERCENT", "ROLE_ORDER", "RUN_KINDS", "Move", "RunKind", "run_kind", "StackMove", "batch_size", "batches", "canary_batches", "canary_hosts_per_kind",
           "canary_plan", "fail_budget_refusal", "reboot_refusals", "rollback_move", "skipped_message",
           "stack_moves_first", "upgrade_move"]
