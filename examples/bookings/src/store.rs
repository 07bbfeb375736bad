//! `BookingStore`: the bookings of one data directory, kept in one JSON file (`bookings.json`)
//! that every change rewrites durably, so the bookings survive a restart or a crash.
//!
//! The file holds the next id, the bookings and the outbox (the messages sent to guests; it
//! stands in for an email gateway). Each change is computed on a copy, written with the storage
//! floor's `replace_file` (a temporary file, fdatasync, rename, directory fsync: a crash leaves
//! the old file or the new one), and only then becomes what the store serves.
//!
//! A booking carries what later checks need: an `id`, its business key (`guest`, `date`), a
//! `version` (the content hash of the record, which changes with every edit) and an internal
//! `payment_token` stored with the record.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The file name of the store inside its data directory.
pub const DATA_FILE: &str = "bookings.json";

/// A bookings file larger than this is refused instead of read into memory.
const MAX_DATA_BYTES: u64 = 64 * 1024 * 1024;

/// One booking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Booking {
    /// The booking's identifier (`bk-1`, `bk-2`, ...).
    pub id: String,
    /// Who stays (with `date`, the booking's business key).
    pub guest: String,
    /// The arrival date, `YYYY-MM-DD`.
    pub date: String,
    /// How many nights.
    pub nights: u32,
    /// `confirmed` or `cancelled`.
    pub status: Status,
    /// The payment provider's token for the guest's card. Internal: it is part of the stored
    /// record, and nothing a caller needs.
    pub payment_token: String,
    /// The content hash of every other field (`sha256:<hex>`): it changes whenever the booking
    /// does, so a caller can say which state it acted on.
    pub version: String,
}

/// Whether a booking stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The booking stands.
    Confirmed,
    /// The booking was cancelled; its record stays.
    Cancelled,
}

/// A message sent to a booking's guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// The booking it is about.
    pub booking_id: String,
    /// Who received it.
    pub guest: String,
    /// What was sent.
    pub text: String,
}

/// The content of `bookings.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Data {
    next_id: u64,
    bookings: Vec<Booking>,
    outbox: Vec<Message>,
}

/// Why a store operation failed. The texts are shown to callers: they name the booking, never
/// its payment token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No booking has this id.
    #[error("there is no booking {0}; list_bookings shows the ids")]
    NotFound(String),
    /// The booking was cancelled already.
    #[error("booking {0} is already cancelled")]
    AlreadyCancelled(String),
    /// Messages are only sent about bookings that stand.
    #[error("booking {0} is cancelled; its guest is not notified")]
    Cancelled(String),
    /// The data file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The data file is not a bookings file.
    #[error("{path} is not a bookings file ({source}); restore it from a backup")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The data file could not be written; nothing changed.
    #[error("cannot save the bookings, nothing changed: {0}")]
    Write(#[from] toolgate::storage::StorageError),
    /// A previous operation panicked while holding the store.
    #[error("the booking store is unusable after an internal error; restart the server")]
    Poisoned,
}

/// The bookings of one data directory.
#[derive(Debug)]
pub struct BookingStore {
    dir: PathBuf,
    data: Mutex<Data>,
}

impl Booking {
    /// The content hash of the record without its `version`.
    fn content_version(&self) -> String {
        let content = (
            &self.id,
            &self.guest,
            &self.date,
            self.nights,
            self.status,
            &self.payment_token,
        );
        // A tuple serializes as a JSON array in field order: the same bytes for the same record.
        let bytes = serde_json::to_vec(&content).unwrap_or_default();
        format!("sha256:{}", hex(&Sha256::digest(bytes)))
    }

    fn seal(mut self) -> Self {
        self.version = self.content_version();
        self
    }
}

impl BookingStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        toolgate::storage::create_dir_durably(&toolgate::storage::FsStorage, &dir)?;
        let path = dir.join(DATA_FILE);
        let data = match toolgate::storage::read_regular(
            &path,
            MAX_DATA_BYTES,
            toolgate::storage::Symlinks::Refuse,
        ) {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes)
                .map_err(|source| StoreError::Corrupt { path, source })?,
            Ok(None) => Data::default(),
            Err(source) => return Err(StoreError::Read { path, source }),
        };
        Ok(BookingStore {
            dir,
            data: Mutex::new(data),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> Result<MutexGuard<'_, Data>, StoreError> {
        self.data.lock().map_err(|_| StoreError::Poisoned)
    }

    /// Applies `change` to a copy of the data, saves the copy, then serves it.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Data) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut data = self.lock()?;
        let mut next = data.clone();
        let out = change(&mut next)?;
        let mut bytes = serde_json::to_vec_pretty(&next).unwrap_or_default();
        bytes.push(b'\n');
        toolgate::storage::replace_file(
            &toolgate::storage::FsStorage,
            &self.dir,
            DATA_FILE,
            &bytes,
        )?;
        *data = next;
        Ok(out)
    }

    /// Every booking (of `guest` only, when given), in creation order.
    pub fn list(&self, guest: Option<&str>) -> Result<Vec<Booking>, StoreError> {
        let data = self.lock()?;
        Ok(data
            .bookings
            .iter()
            .filter(|b| guest.is_none_or(|g| b.guest == g))
            .cloned()
            .collect())
    }

    /// The booking `id`.
    pub fn get(&self, id: &str) -> Result<Booking, StoreError> {
        let data = self.lock()?;
        data.bookings
            .iter()
            .find(|b| b.id == id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(id.to_owned()))
    }

    /// Creates a confirmed booking. Every call creates one: deduplicating retries is not the
    /// store's job.
    pub fn create(&self, guest: &str, date: &str, nights: u32) -> Result<Booking, StoreError> {
        self.change(|data| {
            data.next_id += 1;
            let id = format!("bk-{}", data.next_id);
            // Stands in for the token a payment provider returns when it authorises the card.
            let token = Sha256::digest(format!("{id}\n{guest}\n{date}"));
            let booking = Booking {
                payment_token: format!("pay_{}", hex(&token))[..28].to_owned(),
                id,
                guest: guest.to_owned(),
                date: date.to_owned(),
                nights,
                status: Status::Confirmed,
                version: String::new(),
            }
            .seal();
            data.bookings.push(booking.clone());
            Ok(booking)
        })
    }

    /// Cancels the booking `id` (its record stays, with status `cancelled`).
    pub fn cancel(&self, id: &str) -> Result<Booking, StoreError> {
        self.change(|data| {
            let booking = data
                .bookings
                .iter_mut()
                .find(|b| b.id == id)
                .ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
            if booking.status == Status::Cancelled {
                return Err(StoreError::AlreadyCancelled(id.to_owned()));
            }
            booking.status = Status::Cancelled;
            *booking = booking.clone().seal();
            Ok(booking.clone())
        })
    }

    /// Sends `text` to the guest of booking `id` (appends it to the outbox).
    pub fn notify(&self, id: &str, text: &str) -> Result<Message, StoreError> {
        self.change(|data| {
            let booking = data
                .bookings
                .iter()
                .find(|b| b.id == id)
                .ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
            if booking.status == Status::Cancelled {
                return Err(StoreError::Cancelled(id.to_owned()));
            }
            let message = Message {
                booking_id: booking.id.clone(),
                guest: booking.guest.clone(),
                text: text.to_owned(),
            };
            data.outbox.push(message.clone());
            Ok(message)
        })
    }

    /// Deletes every booking and message; returns how many bookings there were.
    pub fn purge(&self) -> Result<usize, StoreError> {
        self.change(|data| {
            let count = data.bookings.len();
            data.bookings.clear();
            data.outbox.clear();
            Ok(count)
        })
    }

    /// The messages sent so far, oldest first.
    pub fn outbox(&self) -> Result<Vec<Message>, StoreError> {
        Ok(self.lock()?.outbox.clone())
    }
}

/// Lowercase hex of `bytes` (a SHA-256 output is an array without a hex formatter of its own).
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_a_reopen_and_versions_follow_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = BookingStore::open(dir.path()).unwrap();
        let ada = store.create("Ada", "2026-09-01", 2).unwrap();
        let bob = store.create("Bob", "2026-09-01", 1).unwrap();
        assert_eq!((ada.id.as_str(), bob.id.as_str()), ("bk-1", "bk-2"));
        assert_ne!(ada.version, bob.version);
        assert!(ada.payment_token.starts_with("pay_"));
        let cancelled = store.cancel("bk-1").unwrap();
        assert_eq!(cancelled.status, Status::Cancelled);
        assert_ne!(
            cancelled.version, ada.version,
            "a change changes the version"
        );
        assert!(matches!(
            store.cancel("bk-1"),
            Err(StoreError::AlreadyCancelled(_))
        ));
        assert!(matches!(
            store.notify("bk-1", "hi"),
            Err(StoreError::Cancelled(_))
        ));
        store.notify("bk-2", "see you").unwrap();
        assert!(matches!(store.get("bk-9"), Err(StoreError::NotFound(_))));

        let reopened = BookingStore::open(dir.path()).unwrap();
        assert_eq!(reopened.list(None).unwrap(), store.list(None).unwrap());
        assert_eq!(reopened.list(Some("Bob")).unwrap(), vec![bob]);
        assert_eq!(reopened.outbox().unwrap().len(), 1);
        assert_eq!(reopened.create("Cy", "2026-10-01", 3).unwrap().id, "bk-3");
        assert_eq!(reopened.purge().unwrap(), 3);
        assert!(
            BookingStore::open(dir.path())
                .unwrap()
                .list(None)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DATA_FILE), b"{\"bookings\": 7}").unwrap();
        let error = BookingStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains(DATA_FILE) && error.contains("not a bookings file"),
            "{error}"
        );
    }
}
