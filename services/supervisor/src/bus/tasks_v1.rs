//! `org.airlock.Tasks1`, kept for one release beside `Tasks2`.
//!
//! Protocol 3.0 changed `Verify`'s and `CancelTask`'s arguments without
//! renaming the interface, so a client written against the first `Tasks1`
//! got a bare signature error from the bus library. Protocol 7.0 names
//! the current interface `Tasks2` (the D-Bus convention, systemd's and
//! stratisd's: an incompatible change is a new interface version) and
//! serves `Tasks1` beside it: the methods and properties 3.0 to 6.1 had,
//! with their signatures, by the same handlers (this object forwards each
//! call of one of [`tasks_v1::METHODS`] to a [`Tasks`] object),
//! `TaskChanged` emitted on both names, and the introspection data marked
//! deprecated. A method `Tasks2` gained since (`GetPlan`,
//! `ListRepositories`) is neither forwarded nor introspected here: the bus
//! library answers it as an unknown method, so `Tasks1` keeps exactly its
//! locked methods. A call in a shape the interface no longer takes
//! ([`tasks_v1::RETIRED`]) is answered with `PROTOCOL_VERSION_MISMATCH`
//! naming the method to call instead, by the [`super::strict::Strict`]
//! wrapper every interface object is exported in ([`retired`]), as every
//! other call whose arguments are not its row's is answered there.
//!
//! zbus documents its `Interface` trait as one to implement through its
//! macro; it is implemented by hand here (by `strict::wrapper_interface!`,
//! as `Strict`'s is) to serve another object's methods under this name.
//! The forwarding is to the macro's own implementation for `Tasks`;
//! `Cargo.lock` pins the zbus it was written against.

use super::tasks::Tasks;
use airlock_proto::bus::tasks_v1;
use std::fmt::Write;
use zbus::Connection;
use zbus::message::Message;
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::DispatchResult;

/// The Tasks1 interface object: a [`Tasks`] under the old name.
#[derive(Debug)]
pub struct TasksV1 {
    inner: Tasks,
}

impl TasksV1 {
    /// Serves `inner`'s methods as `org.airlock.Tasks1`.
    pub fn new(inner: Tasks) -> Self {
        TasksV1 { inner }
    }
}

/// The retired shape a call of `name` with body signature `signature`
/// has, if it is one.
pub fn retired(name: &str, signature: &str) -> Option<&'static airlock_proto::bus::Retired> {
    tasks_v1::RETIRED
        .iter()
        .find(|r| r.name == name && r.input == signature)
}

/// Whether Tasks1 serves the method `name` (Tasks2 may have more).
pub fn serves(name: &str) -> bool {
    tasks_v1::METHODS.contains(&name)
}

/// Tasks2's introspection data as Tasks1's: renamed, marked deprecated,
/// and without the methods Tasks1 does not serve.
pub fn as_v1(introspection: &str) -> String {
    let from = format!("<interface name=\"{}\">", tasks_v1::SUCCESSOR);
    let to = format!(
        "<interface name=\"{}\">\n  <annotation name=\"org.freedesktop.DBus.Deprecated\" value=\"true\"/>",
        tasks_v1::INTERFACE
    );
    only_served_methods(introspection).replacen(&from, &to, 1)
}

/// `xml` without each `<method>` element Tasks1 does not serve, and the
/// comment (its doc) the bus library writes on the lines just before it.
/// The library writes every element and comment delimiter on a line of
/// its own.
fn only_served_methods(xml: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    // Where the comment just before the next element began, in `out`.
    let mut doc_at = None;
    let mut in_comment = false;
    let mut skipping = false;
    for line in xml.split_inclusive('\n') {
        let t = line.trim();
        if skipping {
            skipping = t != "</method>";
            continue;
        }
        if in_comment {
            out.push(line);
            in_comment = !t.ends_with("-->");
            continue;
        }
        if t.starts_with("<!--") {
            doc_at = Some(out.len());
            out.push(line);
            in_comment = !t.ends_with("-->");
            continue;
        }
        let method = t
            .strip_prefix("<method name=\"")
            .and_then(|rest| rest.split('"').next());
        if method.is_some_and(|name| !serves(name)) {
            if let Some(at) = doc_at.take() {
                out.truncate(at);
            }
            skipping = !t.ends_with("/>");
            continue;
        }
        doc_at = None;
        out.push(line);
    }
    out.concat()
}

impl TasksV1 {
    /// A method Tasks1 does not serve is unknown here (Tasks2 may have it).
    fn refuse<'call>(
        &self,
        _connection: &Connection,
        _msg: &Message,
        name: &MemberName<'_>,
    ) -> Option<DispatchResult<'call>> {
        Self::refuse_mut(name)
    }

    /// As [`Self::refuse`], for `call_mut`.
    fn refuse_mut<'call>(name: &MemberName<'_>) -> Option<DispatchResult<'call>> {
        (!serves(name.as_str())).then_some(DispatchResult::NotFound)
    }
}

super::strict::wrapper_interface! {
    [] TasksV1 {
        fn name() -> InterfaceName<'static> {
            InterfaceName::from_static_str_unchecked(tasks_v1::INTERFACE)
        }

        fn introspect_to_writer(&self, writer: &mut dyn Write, level: usize) {
            let mut inner = String::new();
            self.inner.introspect_to_writer(&mut inner, level);
            let _ = writer.write_str(&as_v1(&inner));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_retired_shape_is_refused_by_name() {
        assert!(retired("Verify", "sss").is_some());
        assert!(retired("Verify", "ss").is_none());
        assert!(retired("GetTask", "sss").is_none());
    }

    #[test]
    fn the_introspection_is_renamed_and_deprecated() {
        let xml = "<interface name=\"org.airlock.Tasks2\">\n  <method name=\"Verify\">";
        let v1 = as_v1(xml);
        assert!(v1.starts_with("<interface name=\"org.airlock.Tasks1\">"));
        assert!(v1.contains("org.freedesktop.DBus.Deprecated"));
        assert!(!v1.contains("Tasks2"));
    }

    #[test]
    fn a_method_tasks2_gained_is_not_introspected_on_tasks1() {
        let xml = "<interface name=\"org.airlock.Tasks2\">\n  <!--\n   One task.\n   -->\n  <method name=\"GetTask\">\n    <arg name=\"task_id\" type=\"s\" direction=\"in\"/>\n  </method>\n  <!--\n   What it will change.\n   -->\n  <method name=\"GetPlan\">\n    <arg name=\"task_id\" type=\"s\" direction=\"in\"/>\n  </method>\n  <method name=\"Later\"/>\n  <!--\n   Version.\n   -->\n  <property name=\"Version\" type=\"s\" access=\"read\"/>\n</interface>\n";
        let v1 = as_v1(xml);
        assert!(v1.contains("<method name=\"GetTask\">") && v1.contains("One task."));
        assert!(
            !v1.contains("GetPlan") && !v1.contains("What it will change."),
            "{v1}"
        );
        assert!(!v1.contains("Later"), "{v1}");
        assert!(v1.contains("Version.") && v1.contains("<property name=\"Version\""));
        assert!(v1.ends_with("</interface>\n"));
        assert!(serves("GetTask") && !serves("GetPlan") && !serves("ListRepositories"));
    }
}
