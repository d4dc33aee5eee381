//! What a reconcile tells the user: the status it writes and the events it publishes, and the
//! report of a state file that does not parse.
use super::*;

/// One of the controller's own files does not parse: no step is taken (the processes run on as
/// they are), and the user reads in Degraded which file it is and what to do. Moving it aside is
/// safe: what it held is observed again (running slots, the front's backend), and a slot whose
/// record had to be rebuilt is replaced by a roll.
pub(super) async fn report_unreadable(
    ctx: &Context,
    shard: &KcpShard,
    path: &Path,
    error: &Error,
) -> Result<(Action, bool), Error> {
    let name = shard.name_any();
    let message = format!(
        "{error}. The controller takes no step for this shard while it cannot read that file; the slots, store and front keep running as they are. Move it aside (mv {path} {path}.bad): the controller then rebuilds what it can observe (running slots, the front's backend) and replaces by a roll a slot whose record it had to rebuild",
        path = path.display()
    );
    tracing::warn!(file = %path.display(), %error, "a state file does not parse");
    let api: Api<KcpShard> = Api::all(ctx.client.clone());
    let stored = stored_status(&api, &name).await?;
    let reported = stored.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.reason == status::UNREADABLE_REASON && c.message == message)
    });
    if !reported {
        publish(ctx, shard, Note::warning("StateFileUnreadable", message.clone())).await;
    }
    let status = status::unreadable(stored.as_ref(), shard.metadata.generation, &message, chrono::Utc::now());
    write_status(&api, &name, stored.as_ref(), &status).await?;
    Ok((Action::requeue(WHEN_IDLE), false))
}

/// The status as stored now (the watcher's copy may lag a write behind).
pub(super) async fn stored_status(
    api: &Api<KcpShard>,
    name: &str,
) -> Result<Option<crate::api::KcpShardStatus>, Error> {
    api.get_status(name)
        .await
        .map(|shard| shard.status)
        .map_err(|cause| Error::Api {
            what: "read the status",
            name: name.to_string(),
            cause,
        })
}

/// Writes `status` as one merge patch over `stored`: an unchanged status is a no-op on the server.
pub(super) async fn write_status(
    api: &Api<KcpShard>,
    name: &str,
    stored: Option<&crate::api::KcpShardStatus>,
    status: &crate::api::KcpShardStatus,
) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status::as_patch(stored, status)),
    )
    .await
    .map(|_| ())
    .map_err(|cause| Error::Api {
        what: "write the status",
        name: name.to_string(),
        cause,
    })
}

pub(super) async fn publish(ctx: &Context, shard: &KcpShard, note: Note) {
    let event = Event {
        type_: note.type_,
        reason: note.reason.into(),
        note: Some(note.message),
        action: "Reconcile".into(),
        secondary: None,
    };
    // A recorder per event: a shared one folds events of the same reason into one series and keeps
    // the first message ("started slot a" would hide "started slot b").
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    if let Err(e) = recorder.publish(&event, &shard.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot record an event");
    }
}
