//! What the reveal store's tests share below the store itself: reveals made
//! from a few fields, seeded random draws, and a SQLite file migrated up to a
//! version. A leaf: the tests of every file of the store use it, and it uses
//! none of them (what needs a whole store is in the store's own tests).

use crate::domain::{AdId, CategoryId, Reveal, Source, UserId, Viewer};

/// A reveal of seller 42's ad `ad` in category 9, at one fixed instant.
pub(super) fn reveal(ad: u64, kind: Source, viewer: Option<&str>) -> Reveal {
    Reveal {
        at_us: 1_700_000_000_000_000,
        viewer: viewer.map(|v| Viewer::parse(v.as_bytes()).unwrap()),
        user: UserId::new(42).unwrap(),
        ad: AdId::new(ad).unwrap(),
        category: CategoryId::new(9).unwrap(),
        kind,
    }
}

/// A reveal of `user`'s ad 1 in category 1 at `at_us`.
pub(super) fn reveal_at(at_us: i64, user: u64, viewer: Option<&str>) -> Reveal {
    Reveal {
        at_us,
        viewer: viewer.map(|v| Viewer::parse(v.as_bytes()).unwrap()),
        user: UserId::new(user).unwrap(),
        ad: AdId::new(1).unwrap(),
        category: CategoryId::new(1).unwrap(),
        kind: Source::RealPhone,
    }
}

/// Small numbers from a seed (a linear congruential generator): the same
/// draws on every run.
pub(super) struct Draws(u64);

impl Draws {
    pub(super) fn new(seed: u64) -> Self {
        Draws(seed)
    }

    /// A number below `n`.
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// A SQLite file with the migrations before `version` applied, as a replica
/// of that time left it, for a test of migration `version` itself.
pub(super) async fn migrated_before(version: i64) -> (tempfile::TempDir, sqlx::SqlitePool) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/old.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for migration in sqlx::migrate!("migrations/sqlite")
        .iter()
        .filter(|m| m.version < version)
    {
        sqlx::raw_sql(&migration.sql).execute(&pool).await.unwrap();
    }
    (dir, pool)
}

/// Migration `version`'s SQL, to run on a file from [`migrated_before`].
pub(super) fn migration(version: i64) -> String {
    let migrations = sqlx::migrate!("migrations/sqlite");
    let found = migrations.iter().find(|m| m.version == version);
    found.expect("that migration").sql.to_string()
}
