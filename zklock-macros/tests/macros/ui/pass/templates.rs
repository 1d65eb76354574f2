//! Every form of key template.
use std::fmt::Display;

use zklock::{distributed_lock, Error};

struct Order {
    user: User,
    id: u64,
}

struct User {
    id: u64,
}

#[distributed_lock("user_{id}")]
async fn braces(id: u64) -> Result<(), Error> {
    let _ = id;
    Ok(())
}

#[distributed_lock("user_<id>")]
async fn angle_brackets(id: u64) -> Result<(), Error> {
    let _ = id;
    Ok(())
}

#[distributed_lock("order_{order.id}_of_{order.user.id}")]
async fn fields(order: Order) -> Result<u64, Error> {
    Ok(order.id + order.user.id)
}

#[distributed_lock("cell_{pos.0}x{pos.1}")]
async fn tuple_index(pos: (u32, u32)) -> Result<(), Error> {
    let _ = pos;
    Ok(())
}

#[distributed_lock("{tenant}/{kind}:<id>")]
async fn several(tenant: &str, kind: String, id: impl Display + Send) -> Result<(), Error> {
    let _ = (tenant, kind, id.to_string());
    Ok(())
}

#[distributed_lock("literal {{braces}} and <<angles>>")]
async fn escaped() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("pair_{a}_{b}")]
async fn destructured((a, b): (u8, u8)) -> Result<u8, Error> {
    Ok(a + b)
}

#[distributed_lock("kind_{r#type}")]
async fn raw_ident(r#type: &str) -> Result<(), Error> {
    let _ = r#type;
    Ok(())
}

#[distributed_lock("user_{id}")]
async fn mutable(mut id: u64) -> Result<u64, Error> {
    id += 1;
    Ok(id)
}

fn main() {
    let order = Order {
        user: User { id: 1 },
        id: 2,
    };
    let _ = (
        braces(1),
        angle_brackets(1),
        fields(order),
        tuple_index((1, 2)),
    );
    let _ = (several("t", "k".into(), 3), escaped(), destructured((1, 2)));
    let _ = (raw_ident("x"), mutable(1));
}
