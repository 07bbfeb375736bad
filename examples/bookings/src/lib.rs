//! bookings: a five-tool MCP server for a bookings domain, written with rmcp alone.
//!
//! This file is the server as its author wrote it before any governance: a `#[tool_router]`, each
//! tool taking `Parameters<T>`, the state in a `store` field. It deliberately knows nothing of
//! what `src/main.rs` puts in front of it (a policy, an audit chain, exactly-once execution,
//! confirmations, the kill switch); `tests/adoption.rs` fails if it ever does.
//!
//! | tool | what it does |
//! |---|---|
//! | `list_bookings(guest?)` | every booking, whole records |
//! | `create_booking(request_id, guest, date, nights)` | one new booking per call |
//! | `cancel_booking(id)` | marks a booking cancelled |
//! | `notify_guest(id, message)` | sends a message to the booking's guest (the outbox) |
//! | `purge_bookings()` | deletes every booking: an administrator's tool |

#![forbid(unsafe_code)]

mod store;

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig, Tool};
use rmcp::{Json, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use store::{Booking, BookingStore, DATA_FILE, Message, Status, StoreError};

/// Arguments of `list_bookings`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only this guest's bookings.
    #[serde(default)]
    pub guest: Option<String>,
}

/// Arguments of `create_booking`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// The caller's identifier of this request (at least 8 characters); a retry of the same
    /// request sends the same one.
    pub request_id: String,
    /// Who stays.
    pub guest: String,
    /// The arrival date, `YYYY-MM-DD`.
    pub date: String,
    /// How many nights (1 to 30).
    pub nights: u32,
}

/// Arguments of `cancel_booking`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// The booking's id (`bk-1`, ...).
    pub id: String,
}

/// Arguments of `notify_guest`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifyArgs {
    /// The booking's id.
    pub id: String,
    /// The text sent to the guest.
    pub message: String,
}

/// Result of `list_bookings`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BookingList {
    /// The bookings, in creation order.
    pub bookings: Vec<Booking>,
}

/// The bookings server.
#[derive(Debug, Clone)]
pub struct Bookings {
    tool_router: ToolRouter<Self>,
    store: Arc<BookingStore>,
}

impl Bookings {
    /// The server over the bookings kept in `data_dir` (created if needed).
    pub fn open(data_dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        Ok(Bookings {
            tool_router: Self::tool_router(),
            store: Arc::new(BookingStore::open(data_dir)?),
        })
    }

    /// Every tool the server registers.
    pub fn tools() -> Vec<Tool> {
        Self::tool_router().list_all()
    }
}

// The store's writes are one small file each, fsynced: short enough to run inside the handlers on
// the multi-thread runtime of `#[tokio::main]`. A busier server would move them to
// `tokio::task::spawn_blocking`.
#[tool_router]
impl Bookings {
    /// List the bookings (of one guest, when `guest` is given), in creation order.
    #[tool(annotations(
        title = "List bookings",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn list_bookings(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<Json<BookingList>, String> {
        // Whole records, payment_token included: deciding which fields may leave the server is
        // not this handler's concern.
        let bookings = self
            .store
            .list(args.guest.as_deref())
            .map_err(|e| e.to_string())?;
        Ok(Json(BookingList { bookings }))
    }

    /// Create a booking for `guest` arriving on `date` (YYYY-MM-DD) for `nights` nights. Give
    /// every new request its own `request_id` and reuse it when retrying that request.
    #[tool(annotations(
        title = "Create booking",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    ))]
    async fn create_booking(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<Json<Booking>, String> {
        if !(1..=30).contains(&args.nights) {
            return Err(format!("nights must be 1 to 30, not {}", args.nights));
        }
        self.store
            .create(&args.guest, &args.date, args.nights)
            .map(Json)
            .map_err(|e| e.to_string())
    }

    /// Cancel the booking `id`. The guest loses the booking; its record stays, cancelled.
    #[tool(annotations(
        title = "Cancel booking",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn cancel_booking(
        &self,
        Parameters(args): Parameters<CancelArgs>,
    ) -> Result<Json<Booking>, String> {
        self.store
            .cancel(&args.id)
            .map(Json)
            .map_err(|e| e.to_string())
    }

    /// Send `message` to the guest of booking `id`.
    #[tool(annotations(
        title = "Notify guest",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn notify_guest(
        &self,
        Parameters(args): Parameters<NotifyArgs>,
    ) -> Result<Json<Message>, String> {
        self.store
            .notify(&args.id, &args.message)
            .map(Json)
            .map_err(|e| e.to_string())
    }

    /// Delete every booking and message. For administrators.
    #[tool(annotations(
        title = "Purge bookings",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn purge_bookings(&self) -> Result<String, String> {
        let count = self.store.purge().map_err(|e| e.to_string())?;
        Ok(format!("purged {count} bookings"))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bookings {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bookings-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Bookings: list_bookings to see them, create_booking with a fresh request_id per new request, cancel_booking and notify_guest by booking id.",
            )
    }
}
