//! A repository's URL, and the store client it names.
//!
//! - `s3://bucket/prefix` (and `s3a://`): Amazon S3 or any S3-compatible
//!   store (`AWS_ENDPOINT_URL`). Credentials come from the environment
//!   (`AWS_ACCESS_KEY_ID`, …), then the shared files' profile
//!   (`AWS_PROFILE`, `~/.aws/credentials`), then what the library finds
//!   itself: a container's credentials or the instance metadata service.
//! - `gs://bucket/prefix`: Google Cloud Storage, credentials from
//!   `GOOGLE_APPLICATION_CREDENTIALS` or the metadata service.
//! - `az://container/prefix`: Azure Blob Storage, from `AZURE_*`.
//! - `http://` and `https://`: a WebDAV server (listing uses `PROPFIND`).

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

use crate::profile;

/// Whether `repo` names an object store rather than a directory.
pub fn is_store_url(repo: &str) -> bool {
    ["s3://", "s3a://", "gs://", "az://", "http://", "https://"].iter().any(|s| repo.starts_with(s))
}

/// A store client and the prefix the repository lies under.
#[derive(Debug)]
pub struct Location {
    /// The client.
    pub store: Arc<dyn ObjectStore>,
    /// The repository's prefix in the bucket (empty: the bucket's root).
    pub prefix: Path,
}

/// How long one request may take.
const REQUEST_TIMEOUT: &str = "60s";
const CONNECT_TIMEOUT: &str = "5s";

/// No retries inside the client: it logs each one on the thread that asked,
/// and downloads ask on threads at the loader's priority, which must not
/// log. A ranged read resumes at the byte in baton's download instead, and
/// a failed listing is tried again by the lister with backoff; both are
/// logged from a thread that may.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 0,
        retry_timeout: Duration::from_secs(20),
    }
}

/// The client for `url`, configured from the environment, then
/// `settings` (the library's configuration keys, such as
/// `aws_endpoint_url`), which win.
pub fn open(url: &str, settings: &[(String, String)]) -> Result<Location, String> {
    let unknown = |key: &str| format!("{url}: unknown store setting '{key}'");
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url} is not a URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url} names no bucket"));
    }
    let prefix = Path::parse(prefix.trim_end_matches('/')).map_err(|e| format!("{url}: {e}"))?;
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        "s3" | "s3a" => {
            let mut builder = AmazonS3Builder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), CONNECT_TIMEOUT);
            for (key, value) in settings {
                let key: AmazonS3ConfigKey = key.to_ascii_lowercase().parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            let given = |name: &str| {
                std::env::var(name).is_ok_and(|v| !v.is_empty())
                    || settings.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
            };
            let env = given;
            let profile = profile::from_env();
            if !env("AWS_ACCESS_KEY_ID")
                && let (Some(id), Some(secret)) = (profile.access_key_id, profile.secret_access_key)
            {
                builder = builder.with_access_key_id(id).with_secret_access_key(secret);
                if let Some(token) = profile.session_token {
                    builder = builder.with_token(token);
                }
            }
            if !env("AWS_REGION")
                && !env("AWS_DEFAULT_REGION")
                && let Some(region) = profile.region
            {
                builder = builder.with_region(region);
            }
            builder.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
        "gs" => {
            let mut builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                .with_config(GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout), CONNECT_TIMEOUT);
            for (key, value) in settings {
                let key: GoogleConfigKey = key.to_ascii_lowercase().parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            builder.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
        "az" => {
            let mut builder = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT)
                .with_config(AzureConfigKey::Client(ClientConfigKey::ConnectTimeout), CONNECT_TIMEOUT);
            for (key, value) in settings {
                let key: AzureConfigKey = key.to_ascii_lowercase().parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            builder.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
        "http" | "https" => {
            // The whole URL is the base; paths are relative to it.
            let store = HttpBuilder::new().with_url(url).with_retry(retry()).build();
            return store
                .map(|s| Location { store: Arc::new(s), prefix: Path::default() })
                .map_err(|e| format!("{url}: {e}"));
        }
        other => {
            return Err(format!("{url}: baton reads s3://, gs://, az://, http:// and https:// stores, not {other}://"));
        }
    };
    let store = built.map_err(|e| format!("{url}: {e}"))?;
    Ok(Location { store, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_bucket_and_prefix() {
        assert!(is_store_url("s3://b/p") && is_store_url("https://host/x") && !is_store_url("/srv/models"));
        let at = open("s3://models/prod/ranking/", &[]).unwrap();
        assert_eq!(at.prefix.as_ref(), "prod/ranking");
        assert_eq!(open("s3://models", &[]).unwrap().prefix.as_ref(), "");
        assert!(open("s3:///x", &[]).unwrap_err().contains("names no bucket"));
        assert!(open("ftp://h/x", &[]).unwrap_err().contains("not ftp://"));
        assert!(open("models/prod", &[]).unwrap_err().contains("not a URL"));
        let typo = [("aws_endpoint_ulr".to_owned(), "x".to_owned())];
        assert!(open("s3://models", &typo).unwrap_err().contains("unknown store setting 'aws_endpoint_ulr'"));
    }
}
