//! Listings of a run root that survive what others plant in it (ST-13, ST-14).
//!
//! Every listing keel does — batches, checkpoints, heads, branches, lives, weights, orders,
//! results, state, quarantine, model folders — goes through [`RunStore::list_tree`] or
//! [`RunStore::list_level`].
//!
//! Invariants:
//! - LI-1: a listing never fails because of one object's name. An object whose key is not one
//!   keel could write (KY-1: a control character, an empty, `.` or `..` segment, a `#`, a
//!   backslash, or not UTF-8) is left out, a warning naming it escaped is logged once per
//!   process, and the rest of the folder is listed.
//! - LI-2: on S3, where object_store fails a whole listing page for such a name, the page is
//!   re-read with fewer keys (bisection on `max-keys`) until the name is isolated; the keys
//!   before it are kept and the listing continues after it (`start-after`; after the whole
//!   folder when the odd segment is a folder). Nothing is lost, nothing is listed twice.
//! - LI-3: a local listing never follows a symbolic link: a link is listed by its own name and
//!   metadata (`lstat`), never descended into and never opened (reads refuse it, ST-13), so a
//!   planted link can only be ignored or quarantined by name. Special files (FIFOs, sockets,
//!   devices) are left out like odd names, so no read can block on one.
//! - LI-4: a local listing never shows staging files of interrupted writes (`#` in the name,
//!   ST-10); a missing folder lists as empty on both backends.

use std::collections::HashSet;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path;
use object_store::ObjectMeta;

use crate::error::StoreError;
use crate::key::{join, validate_rel_key};
use crate::root::RunStore;

/// Keys per S3 listing page (S3's own maximum).
const PAGE_KEYS: usize = 1000;

/// How a run root is listed: its own directory walk (local) or S3's paginated listing.
#[derive(Clone)]
pub(crate) enum Lister {
    /// The directory of a local root.
    Local(PathBuf),
    /// An S3 bucket.
    S3(Arc<dyn PaginatedListStore>),
}

/// One level of a folder: its objects and its sub-folders (full keys, no trailing `/`).
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// Objects directly in the folder.
    pub objects: Vec<ObjectMeta>,
    /// Full keys of the folder's sub-folders.
    pub folders: Vec<String>,
}

impl RunStore {
    /// Every object under the full key `dir` (recursively, unsorted) whose key sorts after
    /// `after` (when given); a missing folder is empty (LI-1..4).
    pub(crate) async fn list_tree(
        &self,
        dir: &str,
        after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        let level = self.list_dir(dir, after, false).await?;
        Ok(level.objects)
    }

    /// The objects and sub-folders directly under the full key `dir` (LI-1..4).
    pub(crate) async fn list_level(&self, dir: &str) -> Result<Level, StoreError> {
        self.list_dir(dir, None, true).await
    }

    async fn list_dir(
        &self,
        dir: &str,
        after: Option<&str>,
        one_level: bool,
    ) -> Result<Level, StoreError> {
        let dir = dir.trim_end_matches('/');
        if !dir.is_empty() {
            validate_rel_key(dir)?;
        }
        let mut level = match self.lister() {
            Lister::Local(root) => {
                if let Some(link) = self.link_in(dir) {
                    warn_once(dir, &link.display().to_string(), "a symbolic link (LI-3)");
                    return Ok(Level::default());
                }
                let (root, dir) = (root.clone(), dir.to_string());
                tokio::task::spawn_blocking(move || walk_local(&root, &dir, one_level))
                    .await
                    .map_err(|e| StoreError::LocalIo {
                        path: e.to_string(),
                        source: std::io::Error::other("the listing task failed"),
                    })??
            }
            Lister::S3(_) => {
                list_s3(self, dir, after.map(str::to_string), one_level, PAGE_KEYS).await?
            }
        };
        if let Some(after) = after {
            level.objects.retain(|m| m.location.as_ref() > after);
        }
        Ok(level)
    }
}

/// LI-1: logs a name keel never writes once per process, escaped.
pub(crate) fn warn_once(dir: &str, name: &str, why: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    let first = seen
        .lock()
        .map(|mut s| s.insert(name.to_string()))
        .unwrap_or(true);
    if first {
        tracing::warn!(dir, name = ?name, why, "ignoring an object keel never writes");
    }
}

/// Whether `key` (a full key) is one keel could have written (KY-1); warns once if not.
fn keep(dir: &str, key: &str) -> bool {
    match validate_rel_key(key) {
        Ok(()) => true,
        Err(e) => {
            warn_once(dir, key, &e.to_string());
            false
        }
    }
}

// ---- local roots: a walk that never follows links --------------------------------------------

/// Walks the local folder `root/dir` without following links (LI-3), skipping odd names (LI-1)
/// and staging files (LI-4).
fn walk_local(root: &FsPath, dir: &str, one_level: bool) -> Result<Level, StoreError> {
    let mut level = Level::default();
    let mut pending = vec![dir.to_string()];
    while let Some(folder) = pending.pop() {
        let path = if folder.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&folder)
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // A regular file where a folder was expected lists as empty, as on S3.
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
            Err(e) => return Err(local_io(&path, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| local_io(&path, e))?;
            let Some(key) = entry_key(dir, &folder, &entry) else {
                continue;
            };
            // `DirEntry::file_type` and `metadata` do not follow links.
            let file_type = entry.file_type().map_err(|e| local_io(&entry.path(), e))?;
            if file_type.is_dir() {
                if one_level {
                    level.folders.push(key);
                } else {
                    pending.push(key);
                }
            } else if file_type.is_file() || file_type.is_symlink() {
                let meta = entry.metadata().map_err(|e| local_io(&entry.path(), e))?;
                level.objects.push(local_meta(&key, &meta)?);
            } else {
                warn_once(dir, &key, "not a regular file (LI-3)");
            }
        }
    }
    Ok(level)
}

/// The full key of a directory entry, or `None` (warned once) for a name keel never writes.
fn entry_key(dir: &str, folder: &str, entry: &std::fs::DirEntry) -> Option<String> {
    let name = match entry.file_name().into_string() {
        Ok(name) => name,
        Err(raw) => {
            let shown = join(folder, &raw.to_string_lossy());
            warn_once(dir, &shown, "the name is not UTF-8");
            return None;
        }
    };
    if name.contains('#') {
        return None; // a staging file of an interrupted write (LI-4, ST-10)
    }
    let key = join(folder, &name);
    keep(dir, &key).then_some(key)
}

fn local_meta(key: &str, meta: &std::fs::Metadata) -> Result<ObjectMeta, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let location = Path::parse(key).map_err(|e| StoreError::InvalidKey {
        key: key.to_string(),
        reason: e.to_string(),
    })?;
    let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
    let last_modified = chrono::DateTime::<chrono::Utc>::from(modified);
    let nanos = last_modified.timestamp_nanos_opt().unwrap_or_default();
    Ok(ObjectMeta {
        location,
        last_modified,
        size: meta.len(),
        // Like object_store's local backend: changes when the file is replaced or rewritten.
        e_tag: Some(format!("{:x}-{:x}-{:x}", meta.ino(), nanos, meta.len())),
        version: None,
    })
}

fn local_io(path: &FsPath, source: std::io::Error) -> StoreError {
    StoreError::LocalIo {
        path: path.display().to_string(),
        source,
    }
}

// ---- S3: pages that survive a name object_store cannot parse ---------------------------------

/// One page of an S3 listing.
struct Page {
    objects: Vec<ObjectMeta>,
    folders: Vec<String>,
    more: bool,
}

impl Page {
    /// The `start-after` that continues the listing after this page.
    fn last(&self) -> Option<String> {
        let objects = self.objects.iter().map(|m| m.location.to_string());
        let folders = self.folders.iter().map(|f| format!("{f}/{}", char::MAX));
        objects.chain(folders).max()
    }
}

/// LI-2: every entry under `dir` on S3, `one_level` with `/` as delimiter, starting after
/// `after`; pages of `page_keys`, each under the deadline (HL-1).
pub(crate) async fn list_s3(
    store: &RunStore,
    dir: &str,
    after: Option<String>,
    one_level: bool,
    page_keys: usize,
) -> Result<Level, StoreError> {
    let Lister::S3(pager) = store.lister() else {
        return Err(StoreError::InvalidRoot {
            root: store.root_url().to_string(),
            reason: "not an S3 root".into(),
        });
    };
    let prefix = (!dir.is_empty()).then(|| format!("{dir}/"));
    let mut offset = after;
    let mut level = Level::default();
    loop {
        let query = Query {
            store,
            pager: pager.as_ref(),
            dir,
            prefix: prefix.as_deref(),
            offset: offset.clone(),
            one_level,
        };
        let (page, odd) = match query.page(page_keys).await? {
            Ok(page) => (page, None),
            Err(source) => {
                let raw = raw_name(dir, &source)?;
                query.isolate(page_keys, raw).await?
            }
        };
        let next = match &odd {
            Some(raw) => {
                warn_once(dir, raw, "object_store cannot name it (LI-2)");
                Some(skip_past(raw))
            }
            None => page.last(),
        };
        let more = page.more || odd.is_some();
        for meta in page.objects {
            if keep(dir, meta.location.as_ref()) {
                level.objects.push(meta);
            }
        }
        level
            .folders
            .extend(page.folders.into_iter().filter(|f| keep(dir, f)));
        match next {
            Some(next) if more => offset = Some(next),
            _ => return Ok(level),
        }
    }
}

/// One listing request's fixed parts.
struct Query<'a> {
    store: &'a RunStore,
    pager: &'a dyn PaginatedListStore,
    dir: &'a str,
    prefix: Option<&'a str>,
    offset: Option<String>,
    one_level: bool,
}

/// A listing page, or the name object_store could not parse in it.
type PageOrOddName = Result<Page, object_store::path::Error>;

impl Query<'_> {
    /// One page of at most `max_keys`, or the name object_store could not parse in it (inner
    /// error); the outer error is the store failing (HL-1/HL-2).
    async fn page(&self, max_keys: usize) -> Result<PageOrOddName, StoreError> {
        let opts = PaginatedListOptions {
            offset: self.offset.clone(),
            delimiter: self.one_level.then_some("/".into()),
            max_keys: Some(max_keys),
            ..PaginatedListOptions::default()
        };
        let request = async {
            match self.pager.list_paginated(self.prefix, opts).await {
                Ok(got) => Ok(Ok(got)),
                Err(object_store::Error::InvalidPath { source }) => Ok(Err(source)),
                Err(e) => Err(StoreError::from_object_store(self.dir, e)),
            }
        };
        let got = match self.store.within_budget(self.dir, request).await? {
            Ok(got) => got,
            Err(source) => return Ok(Err(source)),
        };
        Ok(Ok(Page {
            objects: got.result.objects,
            folders: got
                .result
                .common_prefixes
                .into_iter()
                .map(|p| p.to_string())
                .collect(),
            more: got.page_token.is_some(),
        }))
    }

    /// LI-2: the page of `failing` keys failed on the name `raw`. Bisects the page size until
    /// the largest page that reads is found: its entries are the good ones before the first odd
    /// name, and the smallest failing page names that first odd name. Answers them, or a page
    /// that reads to the end (the odd name went away meanwhile) and `None`.
    async fn isolate(
        &self,
        failing: usize,
        mut raw: String,
    ) -> Result<(Page, Option<String>), StoreError> {
        let (mut good, mut bad) = (0usize, failing);
        let mut kept = Page {
            objects: Vec::new(),
            folders: Vec::new(),
            more: true,
        };
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            match self.page(mid).await? {
                Ok(page) if !page.more => return Ok((page, None)),
                Ok(page) => {
                    good = mid;
                    kept = page;
                }
                Err(source) => {
                    bad = mid;
                    raw = raw_name(self.dir, &source)?;
                }
            }
        }
        Ok((kept, Some(raw)))
    }
}

/// The raw key object_store refused to parse.
fn raw_name(dir: &str, source: &object_store::path::Error) -> Result<String, StoreError> {
    match source {
        object_store::path::Error::BadSegment { path, .. }
        | object_store::path::Error::EmptySegment { path } => Ok(path.clone()),
        other => Err(StoreError::ForeignName {
            dir: dir.to_string(),
            reason: other.to_string(),
        }),
    }
}

/// The `start-after` that skips the odd name `raw`: the key itself, or everything under its
/// first odd folder segment (a common prefix, or a folder holding many keys).
pub(crate) fn skip_past(raw: &str) -> String {
    let mut end = 0;
    for segment in raw.split_inclusive('/') {
        end += segment.len();
        let name = segment.strip_suffix('/').unwrap_or(segment);
        let odd = name.is_empty()
            || name == "."
            || name == ".."
            || name.chars().any(|c| c.is_ascii_control());
        if odd && segment.ends_with('/') {
            return format!("{}{}", &raw[..end], char::MAX);
        }
        if odd {
            break;
        }
    }
    raw.to_string()
}

#[cfg(test)]
#[path = "listing_tests.rs"]
mod tests;
