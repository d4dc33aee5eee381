//! The steps that take up, refuse and complete a restore of a store snapshot.

use chrono::Utc;
use kube::ResourceExt;

use super::Actor;
use super::Notes;
use crate::api::{KcpShard, RESTORE_SNAPSHOT_ANNOTATION};
use crate::controller::Note;
use crate::controller::error::Error;
use crate::controller::plan::{Restorable, RestorePhase, RestoreRecord};

impl Actor<'_> {
    /// Takes up a restore request: records it (from now on the plan stops every slot) and drops
    /// the annotation. A request already taken up only has its annotation dropped.
    pub(super) async fn begin_restore(&self, restorable: &Restorable) -> Result<Notes, Error> {
        let request = self.restore_request()?;
        let mut state = self.dirs.load_state()?;
        let taken = state
            .restore
            .as_ref()
            .is_some_and(|r| r.under_way() && r.request == request);
        if !taken {
            state.restore = Some(RestoreRecord {
                request: request.clone(),
                snapshot: restorable.path.clone(),
                version: restorable.version.clone(),
                phase: RestorePhase::Stopping,
                message: None,
                requested_at: Utc::now(),
                restored_at: None,
                completed_at: None,
            });
            // What a roll under way or a blocked spec remembered is about data the restore replaces.
            state.roll = None;
            state.blocked = None;
            self.dirs.save_state(&state)?;
        }
        self.drop_restore_annotation(&request).await?;
        if taken {
            return Ok(vec![]);
        }
        Ok(vec![Note::warning(
            "RestoreStarted",
            format!(
                "the shard is down for a restore: the front serves no slot, every slot stops, then {} is restored into the store and kcp {} (which served the data in it) starts on it; what was written after the snapshot was taken is gone",
                restorable.path, restorable.version
            ),
        )])
    }

    /// Drops a restore request that cannot be done; the record says why (unless a restore is
    /// under way, which it must not hide).
    pub(super) async fn refuse_restore(&self, message: &str) -> Result<Notes, Error> {
        let request = self.restore_request()?;
        let mut state = self.dirs.load_state()?;
        if !state.restore.as_ref().is_some_and(RestoreRecord::under_way) {
            state.restore = Some(RestoreRecord {
                request: request.clone(),
                snapshot: String::new(),
                version: String::new(),
                phase: RestorePhase::Refused,
                message: Some(message.to_string()),
                requested_at: Utc::now(),
                restored_at: None,
                completed_at: None,
            });
            self.dirs.save_state(&state)?;
        }
        self.drop_restore_annotation(&request).await?;
        Ok(vec![Note::warning(
            "RestoreRefused",
            format!("the restore of {request} is refused: {message}; the shard runs on as it is"),
        )])
    }

    pub(super) fn restore_request(&self) -> Result<String, Error> {
        self.desired
            .restore
            .as_ref()
            .map(|r| r.value.clone())
            .ok_or(Error::NoRestoreRequest {
                annotation: RESTORE_SNAPSHOT_ANNOTATION,
            })
    }

    /// Removes the restore annotation, if it still holds `request` (a new value is a new request).
    pub(super) async fn drop_restore_annotation(&self, request: &str) -> Result<(), Error> {
        let api: kube::Api<KcpShard> = kube::Api::all(self.ctx.client.clone());
        let path = format!(
            "/metadata/annotations/{}",
            RESTORE_SNAPSHOT_ANNOTATION.replace('/', "~1")
        );
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": path, "value": request},
            {"op": "remove", "path": path},
        ]))
        .expect("a valid JSON patch");
        api.patch(
            &self.shard.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Json::<()>(patch),
        )
        .await
        .map(|_| ())
        .map_err(|cause| Error::Api {
            what: "remove the restore annotation",
            name: self.shard.name_any(),
            cause,
        })
    }

    pub(super) fn complete_restore(&self) -> Result<Notes, Error> {
        let mut state = self.dirs.load_state()?;
        let Some(record) = state.restore.as_mut().filter(|r| r.phase == RestorePhase::Starting) else {
            return Ok(vec![]);
        };
        let now = Utc::now();
        record.phase = RestorePhase::Complete;
        record.completed_at = Some(now);
        let message = format!(
            "kcp {} serves the data restored from {} through the front; the shard was down {:.1}s",
            record.version,
            record.snapshot,
            (now - record.requested_at).num_milliseconds() as f64 / 1000.0
        );
        self.dirs.save_state(&state)?;
        Ok(vec![Note::normal("RestoreComplete", message)])
    }
}
