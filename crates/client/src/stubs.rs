//! The client's methods, made from the rows of the contract
//! ([`airlock_proto::rows!`]): per row with a `client` part, one async
//! method on [`crate::Supervisor`] that calls the row's method with the
//! arguments the row maps its parameters to and answers the row's reply
//! type ([`airlock_proto::bus::Call::Reply`]), and one blocking stub of the
//! same name on [`crate::blocking::Supervisor`]. A method's doc is its
//! row's. Nothing here names a method: a row added to the table is a
//! method of both clients.

/// Walks the table and hands each row to `$each` (a macro that takes
/// the interface, the row's type, its doc and its `client` part).
macro_rules! each_row {
    ($each:ident;
        $(
            $(#[doc = $idoc:literal])+
            mod $module:ident = $iface:literal {
                also { $($also:item)* }
                $(
                    $(#[doc = $doc:literal])+
                    $konst:ident = $name:ident ( $input:literal ) -> $output:literal $reply:ty,
                        $pkind:ident $pwhich:ident $(, audited $event:ident)?
                        $(, client $fn:ident ( $($arg:ident : $aty:ty),* ) = $wire:expr)?;
                )+
            }
        )+
    ) => {
        $($(
            $each! {
                $iface, $module, $name, [$($doc)+]
                $(client $fn ( $($arg : $aty),* ) = $wire)?
            }
        )+)+
    };
}

/// `airlock_proto::rows!(async_methods)`: the async methods.
macro_rules! async_methods {
    ($($table:tt)*) => {
        impl Supervisor {
            each_row!(async_method; $($table)*);
        }
    };
}

/// One async method: calls the row's method with `$wire`.
macro_rules! async_method {
    ($iface:literal, $module:ident, $name:ident, [$($doc:literal)+]
        client $fn:ident ( $($arg:ident : $aty:ty),* ) = $wire:expr) => {
        #[doc = concat!("`", $iface, ".", stringify!($name), "`:")]
        $(#[doc = $doc])+
        pub async fn $fn(
            &self,
            $($arg: $aty),*
        ) -> Result<<airlock_proto::bus::$module::$name as airlock_proto::bus::Call>::Reply, airlock_proto::Error> {
            self.call::<airlock_proto::bus::$module::$name, _>(&$wire).await
        }
    };
    // A row the client does not call (the agent host's).
    ($iface:literal, $module:ident, $name:ident, [$($doc:literal)+]) => {};
}

/// `airlock_proto::rows!(blocking_methods)`: the blocking stubs.
macro_rules! blocking_methods {
    ($($table:tt)*) => {
        impl Supervisor {
            each_row!(blocking_method; $($table)*);
        }
    };
}

/// One blocking stub: the async method, driven to completion.
macro_rules! blocking_method {
    ($iface:literal, $module:ident, $name:ident, [$($doc:literal)+]
        client $fn:ident ( $($arg:ident : $aty:ty),* ) = $wire:expr) => {
        #[doc = concat!("`", $iface, ".", stringify!($name), "`:")]
        $(#[doc = $doc])+
        pub fn $fn(
            &self,
            $($arg: $aty),*
        ) -> Result<<airlock_proto::bus::$module::$name as airlock_proto::bus::Call>::Reply, airlock_proto::Error> {
            self.block_on(self.inner.$fn($($arg),*))
        }
    };
    ($iface:literal, $module:ident, $name:ident, [$($doc:literal)+]) => {};
}
