//! Operator views: what [`Lock::keys_in_use`](crate::Lock::keys_in_use)
//! answers, in one shape.

/// The names `found` lists (one per entry: a key, a row, a node; with
/// repeats where a name has several), sorted, each once: the answer of
/// [`Lock::keys_in_use`](crate::Lock::keys_in_use).
///
/// ```
/// use dlock_core::driver::names;
/// assert_eq!(names(["b", "a/1", "b"]), ["a/1", "b"]);
/// ```
pub fn names<I>(found: I) -> Vec<String>
where
    I: IntoIterator,
    I::Item: Into<String>,
{
    let mut names: Vec<String> = found.into_iter().map(Into::into).collect();
    names.sort_unstable();
    names.dedup();
    names
}
