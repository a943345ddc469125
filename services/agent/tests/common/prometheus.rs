//! Scraping the agent's `/metrics` on 127.0.0.1 and checking it with `promtool`.

// Each test binary includes `common` and uses only some of it.
#[allow(unused_imports)]
pub use meshwork_lab::prometheus::{assert_promtool_clean, scrape};
