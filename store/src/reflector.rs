//! The secret superproxies sign their egress reflections with and the
//! control-api checks them by, shared through Redis ([`reflector_key`]).

use uuid::Uuid;

use crate::keys::Keys;
use crate::redis_target;

/// The reflector key ([`Keys::reflector_key`]): the one in Redis, or a new
/// random one stored there first if there is none (`SET NX`, so of two
/// processes racing to make it, both end up with the same key).
pub async fn reflector_key(
    redis: &mut redis_target::RedisConnection,
    keys: &Keys,
) -> redis::RedisResult<Vec<u8>> {
    use redis::AsyncCommands;
    let key = keys.reflector_key();
    // Two v4 UUIDs: 244 random bits from the OS's generator.
    let fresh = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&fresh)
        .arg("NX")
        .query_async(redis)
        .await?;
    let stored: Option<String> = redis.get(&key).await?;
    Ok(stored.unwrap_or(fresh).into_bytes())
}
