//! The errors the API answers with. Each becomes a `metav1.Status` body with the HTTP code, `reason`
//! and `details.causes` that the real kube-apiserver uses, so kubectl and kube-rs print them as they
//! would for a cluster (k8s.io/apimachinery/pkg/api/errors).
use serde_json::{Value, json};

/// Why one field of an object is refused (`metav1.StatusCause`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCause {
    /// Kubernetes cause type, e.g. `FieldValueInvalid`, `FieldValueRequired`,
    /// `FieldValueNotSupported`, `FieldValueDuplicate`, `FieldValueTypeInvalid`.
    pub reason: &'static str,
    /// Dotted path of the field, e.g. `spec.store.type`.
    pub field: String,
    /// What is wrong and, where it helps, what to write instead.
    pub message: String,
}

impl FieldCause {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }
    pub fn not_supported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn unknown(field: impl Into<String>) -> Self {
        let field = field.into();
        Self {
            reason: "FieldValueInvalid",
            message: format!("unknown field \"{field}\""),
            field,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("Unauthorized")]
    Unauthorized,
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("the server could not find the requested resource")]
    NoRoute,
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {message}")]
    Conflict {
        resource: String,
        name: String,
        message: String,
    },
    /// A server-side apply that would change fields other managers own: (message, field) pairs.
    #[error("{message}")]
    ApplyConflict {
        message: String,
        causes: Vec<(String, String)>,
    },
    #[error("{kind}.{group} \"{name}\" is invalid: {}", causes_text(.causes))]
    Invalid {
        kind: String,
        group: String,
        name: String,
        causes: Vec<FieldCause>,
    },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    #[error("request entity too large: limit is {limit} bytes")]
    TooLarge { limit: usize },
    #[error("too old resource version: {requested} ({oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("{0}")]
    NotAcceptable(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The write could not be made durable for lack of space (WebDAV's 507, which clients show with
    /// its message); nothing was written.
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("the server is shutting down")]
    Unavailable,
    /// The server cannot answer in time (a resourceVersion ahead of the store's).
    #[error("{0}")]
    Timeout(String),
}

fn causes_text(causes: &[FieldCause]) -> String {
    let parts: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

impl ApiError {
    pub fn code(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized => 401,
            ApiError::NotFound { .. } | ApiError::NoRoute => 404,
            ApiError::MethodNotAllowed => 405,
            ApiError::NotAcceptable(_) => 406,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => 409,
            ApiError::Expired { .. } => 410,
            ApiError::TooLarge { .. } => 413,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::Invalid { .. } => 422,
            ApiError::Internal(_) => 500,
            ApiError::InsufficientStorage(_) => 507,
            ApiError::Unavailable => 503,
            ApiError::Timeout(_) => 504,
        }
    }

    /// The `metav1.StatusReason`.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::NotFound { .. } | ApiError::NoRoute => "NotFound",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::NotAcceptable(_) => "NotAcceptable",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Expired { .. } => "Expired",
            ApiError::TooLarge { .. } => "RequestEntityTooLarge",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::Internal(_) => "InternalError",
            ApiError::InsufficientStorage(_) => "InsufficientStorage",
            ApiError::Unavailable => "ServiceUnavailable",
            ApiError::Timeout(_) => "Timeout",
        }
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            ApiError::NotFound { resource, name }
            | ApiError::AlreadyExists { resource, name }
            | ApiError::Conflict { resource, name, .. } => {
                // As apimachinery's NewNotFound and its kin: the qualified resource
                // (`kcpshards.kcpshard.io`) split into its resource (`kind`) and `group`, the
                // group left out for the core group.
                let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
                let mut details = json!({"name": name, "kind": plural});
                if !group.is_empty() {
                    details["group"] = json!(group);
                }
                Some(details)
            }
            ApiError::ApplyConflict { causes, .. } => Some(json!({
                "causes": causes.iter().map(|(message, field)| json!({
                    "reason": "FieldManagerConflict", "message": message, "field": field,
                })).collect::<Vec<_>>(),
            })),
            ApiError::Invalid {
                kind,
                group,
                name,
                causes,
            } => Some(json!({
                "name": name,
                "group": group,
                "kind": kind,
                "causes": causes.iter().map(|c| json!({
                    "reason": c.reason, "message": c.message, "field": c.field,
                })).collect::<Vec<_>>(),
            })),
            _ => None,
        };
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
