//! The plan's rules for the preflight of a new version: when it runs, what it waits for, and the
//! interim slot that serves meanwhile when nothing else does.
use super::*;

/// The first slot of the desired template changes the version of the data: another version
/// serves, or (none serving: a re-created shard, an old slot that exited mid-roll) another
/// version served the data last.
pub(super) fn version_changes(desired: &Desired, observed: &Observed) -> bool {
    let version = &desired.template.version;
    let other_serves = observed
        .front
        .backends()
        .iter()
        .filter_map(|b| observed.slot(b))
        .any(|s| &s.template.version != version);
    other_serves || observed.data_version.as_ref().is_some_and(|v| v != version)
}

/// While the preflight of a new version keeps its first slot waiting and nothing serves, a slot
/// of the template that last served the data serves meanwhile (none is started while one is on its
/// way, nor more than a roll runs, nor again for a spec whose interim slot exited before it was
/// ready: it runs that template unchanged, and would crash in a loop). The preflight reads kcp's
/// own schemas from a slot that answers before it copies the data, so it starts once that slot
/// answers (or missed readinessTimeout).
pub(super) fn with_interim(desired: &Desired, observed: &Observed, preflight: Step) -> Step {
    let Some(interim) = desired.interim.as_ref() else {
        return preflight;
    };
    if observed.front_serves() {
        return preflight;
    }
    let on_its_way = observed
        .slots
        .iter()
        .find(|s| s.running && !s.stopping() && &s.template == interim);
    let running = observed.slots.iter().filter(|s| s.running).count();
    match on_its_way {
        Some(s)
            if preflight == Step::StartPreflight
                && !s.health.ready
                && elapsed(observed.now, s.started_at) <= desired.readiness_timeout =>
        {
            Step::Wait(Wait::Ready { slot: s.name.clone() })
        }
        Some(_) => preflight,
        None if running > desired.slots => preflight,
        None if observed.interim_crashed_for.as_ref() == Some(&desired.template) => preflight,
        None => Step::StartInterim {
            name: free_slot_name(observed),
        },
    }
}

/// The preflight of the desired template, before its first slot starts: started, waited for, its
/// copied Lease released, compared or failed, then removed; None once it passed and nothing of it is left.
pub(super) fn preflight(desired: &Desired, observed: &Observed) -> Option<Step> {
    let Some(run) = observed.preflight.as_ref().filter(|p| p.template == desired.template) else {
        return Some(Step::StartPreflight);
    };
    let version = &desired.template.version;
    if let Some(result) = run.result {
        if run.leftovers {
            return Some(remove_preflight(observed));
        }
        let cause = match result {
            PreflightResult::Compatible | PreflightResult::Skipped => return None,
            PreflightResult::SchemaChanged if desired.allow_schema_change => return None,
            PreflightResult::SchemaChanged => BlockCause::PreflightSchemaChanged {
                version: version.clone(),
                changes: run.detail.clone(),
            },
            PreflightResult::Failed => BlockCause::PreflightFailed {
                version: version.clone(),
                detail: run.detail.join("; "),
            },
        };
        return Some(Step::Blocked { cause });
    }
    let fail = |cause| Some(Step::FailPreflight { cause });
    match &run.run {
        PreflightRun::Copying => Some(job::towards_preflight_copy(
            observed.job.as_ref(),
            &desired.template,
            Step::CopyPreflight,
        )),
        PreflightRun::Copied => Some(Step::LaunchPreflight),
        PreflightRun::StoreStarting => Some(Step::Wait(Wait::Preflight)),
        PreflightRun::Exited { last_words } => fail(PreflightFailure::Exited {
            last_words: last_words.clone(),
        }),
        PreflightRun::Running { ready: false, .. } => {
            if elapsed(observed.now, run.launched_at.unwrap_or(run.started_at)) > desired.readiness_timeout {
                fail(PreflightFailure::NotReady {
                    timeout_seconds: desired.readiness_timeout.as_secs(),
                })
            } else {
                Some(Step::Wait(Wait::Preflight))
            }
        }
        PreflightRun::Running {
            lease_released_at: None,
            ..
        } => Some(Step::ReleasePreflightLease),
        // Its controllers lead: whether they work through a big shard's backlog within some time
        // is not asked (alone on a copy of 400 workspaces they needed more than 2 minutes before a
        // new workspace got Ready, docs/benchmarks.md); the roll's probe asks that of the new slot.
        PreflightRun::Running {
            controllers_lead: true, ..
        } => Some(Step::ComparePreflight),
        PreflightRun::Running {
            lease_released_at: Some(released),
            ..
        } => {
            if elapsed(observed.now, *released) > desired.readiness_timeout {
                fail(PreflightFailure::ControllersNotLeading {
                    timeout_seconds: desired.readiness_timeout.as_secs(),
                })
            } else {
                Some(Step::Wait(Wait::Preflight))
            }
        }
    }
}

/// Towards nothing left of a preflight: its copy's job first (it writes where the copy goes), then
/// its kcp and kine, then the copy.
pub(super) fn remove_preflight(observed: &Observed) -> Step {
    let copying = observed
        .job
        .as_ref()
        .is_some_and(|j| j.running() && j.record.kind.preflight_of().is_some());
    if copying {
        Step::CancelJob
    } else if observed.preflight.as_ref().is_some_and(|p| p.processes_running) {
        towards_stopped(observed, Stopping::Preflight, Step::StopPreflight)
    } else {
        Step::RemovePreflight
    }
}
