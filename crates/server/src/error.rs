//! Errors as OpenAI's API returns them: a status and `{"error": {"message", "type", "param",
//! "code"}}`, so clients (the `openai` package among them) raise their usual exceptions.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One failed request: its status and the one-line message the client sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None }
    }

    /// A 400 naming the field at fault.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()) }
    }

    pub fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None }
    }

    /// OpenAI's `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16().to_string(),
            }
        })
    }
}

impl From<engine::Error> for ApiError {
    fn from(e: engine::Error) -> ApiError {
        if let engine::Error::QueueFull { max } = e {
            ApiError::status(
                StatusCode::TOO_MANY_REQUESTS,
                format!("the server is busy ({max} requests running or queued); retry later"),
            )
        } else if e.is_request_error() {
            ApiError::bad_request(e.to_string())
        } else if matches!(e, engine::Error::Stopped) {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")
        } else {
            tracing::error!("request failed in the engine: {e}");
            ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

impl From<crate::GenerateError> for ApiError {
    fn from(e: crate::GenerateError) -> ApiError {
        use crate::GenerateError;
        match e {
            GenerateError::Engine(e) => e.into(),
            GenerateError::Sampling(e) => ApiError::bad_request(e.to_string()),
            GenerateError::Chat(e) => ApiError::field("messages", e.to_string()),
            GenerateError::NoChatTemplate(_) => {
                ApiError::bad_request("this model has no chat template: use /v1/completions")
            }
            e @ GenerateError::EffortUnread(_) => ApiError::field("reasoning_effort", e.to_string()),
            GenerateError::NoToolCalls(why) => ApiError::field("tools", why),
            e @ GenerateError::EosUnderGrammar => ApiError::field("ignore_eos", e.to_string()),
            GenerateError::Constraint(text::constraint::ConstraintError::Grammar(why)) => {
                ApiError::field("response_format", why)
            }
            GenerateError::Constraint(e) => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            // Turning generated ids into text: the server's fault, not the request's.
            GenerateError::Tokenizer(e) => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
